"""What a protocol entry may declare: its abilities, the settings it may limit, and the
reasons it gives for refusing (:class:`psgd.protocols.Protocol`'s ``abilities`` and ``reasons``)."""

#: what a protocol may declare it can do (``Protocol.abilities``), and what that means
ABILITIES = {
    "overlap": "--overlap (pull during the computation) applies; it also needs a bound >= 1",
    "server-snapshots": "checkpoints are assembled from the servers' shards (else the lead "
                        "worker writes its own replica)",
    "resume-optimizer": "a checkpoint's optimizer state is loaded on resume (which then needs "
                        "the same --optimizer)",
    "replay": "--record / --replay apply: its servers handle every push and pull themselves, in "
              "an order they can write down (psgd.ps.order)",
    "compress": "--compress applies: its workers push, or all-reduce, through psgd.compress",
    "momentum-correction": "--momentum-correction on applies (psgd.protocols.momentum): the "
                           "workers can keep the momentum the step would apply",
    "momentum-gain": "--momentum-correction gain applies, and auto means it with error "
                     "feedback (psgd.compress.gain): the servers step plain SGD at the "
                     "momentum's gain on every worker's push of a clock at once",
    "hot-rows": "--hold-hot applies: sparse workers hold their changes to the rows most batches "
                "touch (psgd.hogwild.hot)",
    "elastic": "--elastic applies: workers may be lost and join while the servers run "
               "(psgd.elastic); the servers' version, bound and barrier count the live workers "
               "only, so it needs a protocol whose servers see every push",
    "elastic-ring": "--elastic applies as a ring at one node: the worker jobs merge into one "
                    "communicator with the coordinator, and each clock sums the gradients of "
                    "the workers still alive (psgd.elastic.ring)",
    "elastic-pairs": "--elastic applies as pairs at one node: the worker jobs merge into one "
                     "communicator with the coordinator, which tells the survivors each new "
                     "live set; a lost worker's partners drop its pairing and redraw theirs "
                     "(psgd.elastic.pairs)",
    "elastic-windows": "--elastic applies as RMA windows at one node: the worker jobs merge "
                       "into one communicator with the coordinator, which holds the windows "
                       "they add to; the survivors take a lost worker's share of the run's "
                       "updates (psgd.elastic.hogwild)",
    "elastic-replicas": "--replicas 2 applies under --elastic: a backup job follows the server's "
                        "applied updates in order and takes over when the server job is lost "
                        "(psgd.elastic.replica)",
}
#: what a protocol may refuse some values of (its other ``Protocol.reasons`` keys), and where
LIMITS = {
    "optimizer": "--optimizer: those outside its optimizers",
    "staleness-comp": "--staleness-comp: the methods outside its compensations",
    "error-feedback": "--error-feedback on: with the compressors of its feedback_refused",
    "pipeline": "--pipeline: the schedules outside its pipelines",
}
#: the reasons an entry gives unless it declares its own
DEFAULT_REASONS = {"staleness-comp": "its steps are never stale",
                   "replay": "it has no servers whose order of pushes could be recorded",
                   "elastic": "the servers must see every push to drop a lost worker"}
