"""Extensions from outside psgd's tree: ``PSGD_PLUGINS=module[,module...]``.

Each module is imported before the command line is read, on every rank, and registers
what it adds: a protocol (:func:`psgd.protocols.register`), a compressor
(:func:`psgd.compress.register`), a layer token (:func:`psgd.nn.spec.register`).
"""
from __future__ import annotations

import importlib
import os

from psgd.errors import UsageError

VARIABLE = "PSGD_PLUGINS"


def load(environ=os.environ) -> list[str]:
    """Import the modules ``PSGD_PLUGINS`` names (once each); returns their names.

    Raises
    ------
    UsageError
        A module that does not import (the message names it and the variable).
    """
    names = [n.strip() for n in environ.get(VARIABLE, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(f"{VARIABLE}: cannot import {name!r} ({exc}); put its folder on "
                             f"PYTHONPATH") from None
    return names
