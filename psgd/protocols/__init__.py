"""Protocols: the registry (:mod:`psgd.protocols.registry`) and its built-in entries
(:mod:`psgd.protocols.builtin`); this package only hands their names on."""
from psgd.protocols.abilities import ABILITIES, DEFAULT_REASONS, LIMITS
from psgd.protocols.registry import (AUTO, DEFAULT_STALENESS_MAX, PROTOCOLS, Protocol, get, load,
                                     names, register)
from psgd.protocols import builtin  # noqa: E402,F401 (registers the built-in entries)

__all__ = ["ABILITIES", "DEFAULT_REASONS", "LIMITS", "AUTO", "DEFAULT_STALENESS_MAX", "PROTOCOLS",
           "Protocol", "get", "load", "names", "register"]
