"""The protocol registry: :class:`Protocol` (what the rest of psgd may ask about a protocol),
:data:`PROTOCOLS` and the functions that look entries up (:func:`get`, :func:`names`).

The built-in entries are in :mod:`psgd.protocols.builtin`; a plugin adds its own with
:func:`register`. Halves are named by module path and imported only when a job runs them.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

from psgd.config import ProtocolConfig
from psgd.errors import UsageError
from psgd.nn.optim import OPTIMIZERS
from psgd.protocols.abilities import ABILITIES, DEFAULT_REASONS, LIMITS
from psgd.ps import compensation

AUTO = "auto"                 # --staleness auto: the servers set the bound (psgd.ps.adaptive)
DEFAULT_STALENESS_MAX = 16    # its largest value unless --staleness-max says otherwise


@dataclass(frozen=True)
class Protocol:
    """What the rest of psgd may ask about a protocol.

    Attributes
    ----------
    name : str
        The ``--protocol`` value.
    summary : str
        One paragraph for ``psgd train --help``.
    servers : bool
        True: ranks ``0..S-1`` are parameter servers (S >= 1); False: no servers (S = 0).
    bound : float or None
        The staleness bound in clocks (0 for bsp, inf for asp); None when the
        user sets it with ``--staleness`` (default :attr:`default_staleness`).
    default_staleness : int
        The bound when ``--staleness`` is not given (only when ``bound`` is None).
    optimizers : tuple of str
        The optimizers the protocol runs.
    abilities : frozenset of str
        What it can do, each a key of :data:`ABILITIES` (which says what each means).
    compensations : tuple of str or None
        The ``--staleness-comp`` methods it runs (:mod:`psgd.ps.compensation`; None: every
        registered method, those registered later included); the default is ``auto`` where
        it runs, else ``none``.
    staleness_unit : str
        What its staleness histogram counts: ``clocks`` (a server's version
        minus the one a push was computed on) or ``updates`` (hogwild).
    feedback_refused : tuple of str
        Compressors (by name) it runs without ``--error-feedback on``.
    pipelines : tuple of str
        The ``--pipeline`` schedules under which it combines each stage's replicas.
    reasons : dict
        Why it refuses, by an ability it lacks (a key of :data:`ABILITIES`) or a setting it
        limits (a key of :data:`LIMITS`); every refusal line ends with it (:meth:`why_not`).
    graph : str or None
        ``"module:function"`` of a decentralized protocol's graph,
        ``function(topology, n_workers)``, which raises ValueError for a
        topology it cannot run on (the protocol then takes ``--topology``);
        None: no ``--topology``.
    worker : str
        ``"module:Class"`` of the worker half, a :class:`psgd.halves.WorkerHalf` with the
        shape of :class:`psgd.protocols.interfaces.WorkerHalf` (a decentralized one also
        that of :class:`~psgd.protocols.interfaces.DecentralizedWorker`).
    server : str or None
        ``"module:function"`` of the server half
        (:class:`psgd.protocols.interfaces.ServerHalf`).
    cost : str or None
        ``"module:function"`` of its rows in ``psgd plan``: ``function(job, network, name)``
        returning ``{row name: (seconds per worker step, synchronous)}``
        (:mod:`psgd.plan.cost`); None: no rows.
    example : dict
        The example run the job scripts, the fault tests and the Open MPI check start
        (:meth:`example_run`): what differs from 3 ranks, the entry's servers, momentum (or
        its first optimizer) and ``jobs/configs/NAME.toml``.
    update_rule : str or None
        ``"module:Class"`` of a parameter server's update rule, a
        :class:`psgd.ps.update.UpdateRuleBase` with the shape of
        :class:`psgd.protocols.interfaces.UpdateRule`.
    """

    name: str
    summary: str
    servers: bool
    worker: str
    server: str | None = None
    update_rule: str | None = None
    bound: float | None = 0.0
    default_staleness: int = 2
    optimizers: tuple[str, ...] = OPTIMIZERS
    abilities: frozenset[str] = frozenset({"resume-optimizer"})
    compensations: tuple[str, ...] | None = ("none",)
    staleness_unit: str = "clocks"
    feedback_refused: tuple[str, ...] = ()
    pipelines: tuple[str, ...] = ()   # --pipeline schedules whose stage replicas it combines
    reasons: dict = field(default_factory=dict, hash=False)
    graph: str | None = None
    cost: str | None = None
    example: dict = field(default_factory=dict, hash=False)

    def staleness_bound(self, staleness: int | str | None,
                        staleness_max: int | None = None) -> float:
        """The bound in force, given ``--staleness`` (None when not given; ``auto``: its maximum).

        Raises
        ------
        ValueError
            ``--staleness`` given to a protocol whose bound is fixed, or negative;
            ``--staleness-max`` without ``--staleness auto``, or below 1.
        """
        if self.bound is not None:
            if staleness is not None:
                given = " auto" if staleness == AUTO else ""
                raise ValueError(f"--staleness{given} applies to --protocol "
                                 f"{names(bound=None)} only, not {self.name}")
        if staleness_max is not None and staleness != AUTO:
            raise ValueError(f"--staleness-max applies to --staleness {AUTO} only")
        if self.bound is not None:
            return self.bound
        if staleness == AUTO:
            staleness_max = DEFAULT_STALENESS_MAX if staleness_max is None else staleness_max
            if staleness_max < 1:
                raise ValueError(f"--staleness-max must be >= 1, got {staleness_max}")
            return float(staleness_max)
        staleness = self.default_staleness if staleness is None else staleness
        if staleness < 0:
            raise ValueError(f"--staleness must be >= 0, got {staleness}")
        return float(staleness)

    def __post_init__(self) -> None:
        unknown = set(self.abilities) - set(ABILITIES)
        if unknown:
            raise UsageError(f"protocol {self.name!r}: unknown abilities {sorted(unknown)}; "
                             f"known: {', '.join(ABILITIES)}")
        odd = set(self.reasons) - (set(ABILITIES) - set(self.abilities)) - set(LIMITS)
        if odd:
            raise UsageError(f"protocol {self.name!r}: reasons for {sorted(odd)}, which are no "
                             f"ability it lacks nor one of {', '.join(LIMITS)}")

    def why_not(self, key: str) -> str:
        """``": reason"`` for refusing ``key`` (an ability it lacks, or a key of :data:`LIMITS`)
        as its entry declares it (else :data:`DEFAULT_REASONS`); ``""`` when none is."""
        if key not in ABILITIES and key not in LIMITS:
            raise KeyError(f"{key!r} is not one of {', '.join(ABILITIES)}, {', '.join(LIMITS)}")
        text = self.reasons.get(key, DEFAULT_REASONS.get(key))
        return f": {text}" if text else ""

    def can(self, ability: str) -> bool:
        """Whether it has ``ability`` (a key of :data:`ABILITIES`)."""
        if ability not in ABILITIES:
            raise KeyError(f"{ability!r} is not one of {', '.join(ABILITIES)}")
        return ability in self.abilities

    def check_pipeline(self, schedule: str) -> None:
        """Refuse a ``--pipeline`` schedule whose stage replicas it does not combine, with why."""
        if schedule not in self.pipelines:
            able = " or ".join(p.name for p in PROTOCOLS.values() if schedule in p.pipelines)
            raise ValueError(f"--protocol {self.name} does not combine the replicas of a "
                             f"--schedule {schedule} pipeline{self.why_not('pipeline')}; {able} does")

    def compensation_choices(self) -> tuple[str, ...]:
        """The ``--staleness-comp`` values it takes."""
        return compensation.choices() if self.compensations is None else self.compensations

    def default_compensation(self) -> str:
        """``auto`` where it runs, else ``none``."""
        return compensation.AUTO if compensation.AUTO in self.compensation_choices() else "none"

    def compensation(self, method: str | None, optimizer: str,
                     comp_lambda: float | None = None, worker_momentum: bool = False) -> str:
        """The compensation method that runs, given ``--staleness-comp`` (None: the default);
        ``worker_momentum``: the workers keep the momentum (``--momentum-correction``).

        Raises
        ------
        ValueError
            An unknown method, one this protocol cannot run, or a lambda it does not take.
        """
        runs = self.compensation_choices()
        method = self.default_compensation() if method is None else method
        resolved = compensation.resolve(method, optimizer, runs, worker_momentum)
        if method not in runs:
            raise ValueError(f"--staleness-comp {method} does not apply to --protocol "
                             f"{self.name}{self.why_not('staleness-comp')}; choose one of "
                             f"{', '.join(runs)}")
        if comp_lambda is not None and resolved != "dcasgd":
            raise ValueError(f"--comp-lambda applies to --staleness-comp dcasgd only, "
                             f"not {method}")
        if comp_lambda is not None and not comp_lambda >= 0:
            raise ValueError(f"--comp-lambda must be >= 0, got {comp_lambda}")
        return resolved

    def topology(self, topology: str | None, n_workers: int | None = None) -> str | None:
        """The topology in force, given ``--topology`` (None: the default), checked for
        ``n_workers`` when given.

        Raises
        ------
        ValueError
            ``--topology`` given to a protocol without one, or a topology unknown or
            impossible for ``n_workers``.
        """
        if self.graph is None:
            if topology is not None:
                raise ValueError(f"--topology applies to --protocol {names(decentralized=True)} "
                                 f"only, not {self.name}")
            return None
        from psgd.gossip.topology import DEFAULT, TOPOLOGIES
        topology = DEFAULT if topology is None else topology
        if topology not in TOPOLOGIES:
            raise ValueError(f"--topology {topology!r} is not one of {', '.join(TOPOLOGIES)}")
        if n_workers is not None:
            load(self.graph)(topology, n_workers)
        return topology

    @property
    def decentralized(self) -> bool:
        """Each worker keeps its own model (the protocol takes ``--topology``)."""
        return self.graph is not None

    def check(self, *, staleness: int | str | None = None, overlap: bool = False,
              optimizer: str = "sgd", n_servers: int | None = None,
              staleness_max: int | None = None,
              topology: str | None = None, n_workers: int | None = None) -> float:
        """Validate a run's protocol settings; return the staleness bound in force (auto: its
        maximum). The features' options check their own flags against :meth:`can`
        (:mod:`psgd.protocols.features`).

        Raises
        ------
        ValueError
            Naming the first setting the protocol cannot run with.
        """
        bound = self.staleness_bound(staleness, staleness_max)
        if overlap and not (self.can("overlap") and bound >= 1):
            raise ValueError(f"--overlap needs --protocol {names(able='overlap')} with a staleness "
                             f"bound >= 1, not {self.label(bound)}: otherwise a worker's next "
                             f"parameters wait for its own push")
        if n_servers is not None and self.servers and n_servers < 1:
            raise ValueError(f"--protocol {self.name} needs at least one server (--servers >= 1)")
        if n_servers is not None and not self.servers and n_servers != 0:
            raise ValueError(f"--protocol {self.name} has no servers: use --servers 0, "
                             f"not {n_servers}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if optimizer not in self.optimizers:
            raise ValueError(f"optimizer {optimizer!r} is not supported with --protocol "
                             f"{self.name}{self.why_not('optimizer')}; choose one of "
                             f"{', '.join(self.optimizers)}")
        self.topology(topology, n_workers)
        return bound

    def label(self, bound: float | None = None, auto: bool = False) -> str:
        """The protocol as a run summary names it, e.g. ``ssp (s=2)``, ``ssp (s=auto <= 16)``."""
        if self.bound is None and bound is not None:
            return f"{self.name} (s={f'{AUTO} <= ' if auto else ''}{bound:g})"
        return self.name

    def config(self, n_params: int, *, compensation, staleness: int | str | None = None,
               overlap: bool = False, optimizer: str = "sgd", staleness_max: int | None = None,
               topology: str | None = None, n_workers: int | None = None,
               **settings) -> ProtocolConfig:
        """The :class:`ProtocolConfig` every rank of a run is given (validated by :meth:`check`),
        its ``compensation`` (the plan's options, :mod:`psgd.protocols.features`) holding the
        method that runs (``auto`` and the default resolved); the other features the halves
        read are passed in ``settings`` (:func:`psgd.protocols.features.make_config` fills
        their defaults)."""
        bound = self.check(staleness=staleness, overlap=overlap, optimizer=optimizer,
                           staleness_max=staleness_max, topology=topology, n_workers=n_workers)
        method = self.compensation(compensation.staleness_comp, optimizer,
                                   compensation.comp_lambda,
                                   settings.get("worker_momentum") is not None)
        return ProtocolConfig(protocol=self.name, n_params=n_params, optimizer=optimizer,
                              staleness=bound, staleness_auto=staleness == AUTO,
                              overlap=overlap,
                              compensation=replace(compensation, staleness_comp=method),
                              topology=self.topology(topology),
                              update_rule=load(self.update_rule) if self.update_rule else None,
                              **settings)

    def example_run(self) -> dict:
        """``ranks``, ``servers``, ``optimizer`` and ``config`` (a path from the repository
        root) of the entry's example run: the defaults, then :attr:`example`."""
        optimizer = "momentum" if "momentum" in self.optimizers else self.optimizers[0]
        return {"ranks": 3, "servers": int(self.servers), "optimizer": optimizer,
                "config": f"jobs/configs/{self.name}.toml", **self.example}

    def cost_model(self):
        """The function named by :attr:`cost` (imported now)."""
        return load(self.cost)

    def make_worker(self, roles, shard_map, config: ProtocolConfig):
        """The worker half of this protocol for this rank."""
        return load(self.worker)(roles, shard_map, config)

    def serve(self, roles, shard_map, config: ProtocolConfig, **kwargs):
        """Run the server half on this rank until every worker is done."""
        if self.server is None:
            raise ValueError(f"--protocol {self.name} has no server ranks")
        return load(self.server)(roles, shard_map, config, **kwargs)


def register(entry: Protocol) -> Protocol:
    """Add ``entry`` to :data:`PROTOCOLS` (a plugin's protocol, :mod:`psgd.plugins`); UsageError
    if its name is taken."""
    if entry.name in PROTOCOLS:
        raise UsageError(f"protocol {entry.name!r} is registered already")
    PROTOCOLS[entry.name] = entry
    return entry


def names(able: str | None = None, **match) -> str:
    """The protocols that have ability ``able`` (if given) and whose attributes equal
    ``match``, as ``a or b`` (e.g. ``names(servers=False)``, ``names(able="overlap")``)."""
    return " or ".join(p.name for p in PROTOCOLS.values()
                       if (able is None or p.can(able))
                       and all(getattr(p, k) == v for k, v in match.items()))


def load(ref: str):
    """The object named by ``"module:attr"`` (imported now)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def get(name: str) -> Protocol:
    """The protocol called ``name``; ValueError naming the choices otherwise."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"--protocol {name!r} is not one of {', '.join(PROTOCOLS)}") from None


PROTOCOLS: dict[str, Protocol] = {}
