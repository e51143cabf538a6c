"""psgd's seven built-in protocols, each one :class:`~psgd.protocols.registry.Protocol` entry
registered at import (the package's ``__init__`` imports this module)."""
import math

from psgd.protocols.registry import Protocol, register

_PS = dict(servers=True, worker="psgd.ps.worker:PSWorker", server="psgd.ps.server:serve",
           pipelines=("gpipe", "1f1b"), reasons={"pipeline": (
               "pipedream and pipemare step a stage after every microbatch on the weights "
               "its schedule keeps (stashed or predicted), which a pull from the servers would "
               "replace between a microbatch's forward and its backward")})
_OWN_MODELS = {"pipeline": "every worker keeps a model of its own, so a stage's replicas would "
                           "drift apart",
               "compress": "its workers average whole models with their neighbours, not "
                           "gradients"}
_PS_CAN = frozenset({"server-snapshots", "replay", "compress", "resume-optimizer",
                     "momentum-correction"})
_COST = "psgd.plan.rows:"   # the cost models, imported only by psgd plan
_STALE = dict(compensations=None)

for _entry in (
    Protocol("bsp", update_rule="psgd.ps.bsp:BspUpdate", bound=0.0, **_PS, cost=_COST + "bsp_rows",
             abilities=_PS_CAN | {"momentum-gain", "elastic"}, summary=(
        "bulk-synchronous: the server averages all workers' gradients of a clock and steps "
        "once; equals synchronous SGD on the union of the batches")),
    Protocol("ssp", update_rule="psgd.ps.ssp:SspUpdate", bound=None, **_PS, **_STALE,
             cost=_COST + "async_rows",
             abilities=_PS_CAN | {"overlap", "elastic", "elastic-replicas"}, summary=(
        "stale-synchronous (Ho et al. 2013): a worker at clock c waits until every worker has "
        "pushed clock c-s (--staleness s, default 2; --staleness auto: the servers set s "
        "online, up to --staleness-max); pushes are applied on arrival")),
    Protocol("asp", update_rule="psgd.ps.ssp:SspUpdate", bound=math.inf, **_PS,
             cost=_COST + "async_rows", **_STALE,
             abilities=_PS_CAN | {"overlap", "elastic", "elastic-replicas"},
             summary="asynchronous (Downpour SGD): ssp with s = inf, never wait"),
    Protocol(
        "hogwild", servers=True, worker="psgd.hogwild.worker:HogwildWorker",
        server="psgd.hogwild.server:serve_hogwild", bound=math.inf, staleness_unit="updates",
        abilities=frozenset({"hot-rows", "elastic-windows"}), cost=_COST + "hogwild_rows",
        example={"optimizer": "sgd"}, optimizers=("sgd", "momentum", "nesterov", "adagrad"),
        compensations=("none", "inverse", "amom", "auto"),
        reasons={
            "pipeline": ("its workers add to one copy of the whole model lock-free, with no "
                         "servers of a stage's own"),
            "staleness-comp": ("a hogwild worker never sees the parameters its update lands on, "
                               "which dcasgd and gap need"),
            "replay": ("its workers read and add to the servers' memory one-sided and "
                       "lock-free, so no rank sees, or could impose, the order of updates"),
            "compress": "its workers add their updates to the servers' memory, with no push",
            "optimizer": ("Adam's bias correction and second-moment scaling assume one stream "
                          "of its own updates to one copy of the parameters, but under hogwild "
                          "every worker adds to the same copy (use --protocol asp, whose "
                          "server runs Adam)")},
        summary=(
            "lock-free one-sided MPI (Niu et al. 2011): workers step their optimizer locally, "
            "MPI_Get the parameters and MPI_Accumulate the difference into the servers' RMA "
            "windows, with no server involvement. Reads may be torn across elements, but each "
            "element's accumulate is atomic, so no update is ever lost; optimizer state stays "
            "on the workers (sgd, momentum, nesterov, adagrad; adam is refused)")),
    Protocol(
        "allreduce", servers=False, worker="psgd.collectives.allreduce_worker:AllreduceWorker",
        abilities=frozenset({"compress", "momentum-correction", "resume-optimizer",
                             "elastic-ring"}),
        feedback_refused=("fp16",),
        cost=_COST + "allreduce_rows", example={"ranks": 2},
        pipelines=("gpipe", "1f1b", "pipedream", "pipemare"),
        reasons={"error-feedback": ("its ring rounds every partial sum to half precision, "
                                    "which no worker's residual could hold")},
        summary=("no servers (--servers 0): gradients are averaged with psgd's all-reduce and "
                 "every worker applies the same step to its replica (--compress fp16: a ring "
                 "of half-precision messages; qsgd, topk, sign: an all-gather of encodings)")),
    Protocol(
        "gossip", servers=False, worker="psgd.gossip.dpsgd:GossipWorker",
        graph="psgd.gossip.topology:mixing_matrix", cost=_COST + "gossip_rows",
        reasons=_OWN_MODELS,
        summary=("decentralized synchronous gossip (D-PSGD, Lian et al. 2017; --servers 0): each "
                 "worker keeps its own model and optimizer, and every step averages it with its "
                 "neighbours on --topology ring, torus, exponential or complete (default ring), "
                 "then steps with its own gradient")),
    Protocol(
        "adpsgd", servers=False, worker="psgd.gossip.adpsgd:AdpsgdWorker",
        graph="psgd.gossip.adpsgd:partners", cost=_COST + "adpsgd_rows", example={"ranks": 2},
        abilities=frozenset({"elastic-pairs"}),
        reasons=_OWN_MODELS,
        summary=("asynchronous gossip (AD-PSGD, Lian et al. 2018; --servers 0): each worker "
                 "keeps its own model and, whenever ready, averages it with one neighbour "
                 "drawn at random (seeded) on --topology, with no global step (only the log "
                 "records' model average and the stop checks meet); even workers start the "
                 "averages, odd ones answer them")),
):
    register(_entry)
