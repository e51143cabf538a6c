"""The shape of one feature's options: its flags, its ``--help`` section, and its part of the plan.

A feature is a frozen dataclass whose fields are its flags' names (also its TOML keys and
``PSGD_<NAME>`` variables). :meth:`Options.resolved` checks the given values against the
run's core settings and the protocol's declared abilities and returns them with their
defaults filled in; :class:`psgd.run.run_plan.RunPlan` holds the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping


@dataclass(frozen=True)
class Options:
    """One feature's settings (subclasses add the fields, one per flag)."""

    KEY: ClassVar[str]                                # its field of the RunPlan
    TITLE: ClassVar[str]                              # its section of ``psgd train --help``
    FLAGS: ClassVar[dict[str, tuple]]                 # flag name -> (type, help[, metavar])
    #: a run mode's options (pipeline, tensor grid): the settings that mode does not run,
    #: flag name -> why, refused while the mode is on (psgd.run.run_plan.refused_by)
    REFUSES: ClassVar[dict[str, str]] = {}

    @classmethod
    def from_flat(cls, values: Mapping):
        """The options among a flat mapping of settings (the others are ignored)."""
        return cls(**{name: values[name] for name in cls.FLAGS if name in values})

    def as_dict(self) -> dict:
        """Flag name -> value, as the config record and checkpoints store them."""
        return {name: getattr(self, name) for name in self.FLAGS}

    def refusal(self, name: str, why: str) -> str:
        """The line refusing setting ``name`` (one of :attr:`REFUSES`) under this mode."""
        return f"--{name.replace('_', '-')} does not work under --{self.KEY}: {why}"

    def resolved(self, plan, protocol):
        """These options checked against ``plan`` (its core settings resolved, and the
        features before this one) and ``protocol``'s abilities, with their defaults filled;
        UsageError naming the first bad flag."""
        return self

