"""The progress bar of the lead worker: shown only when the job's output goes to a terminal."""
from __future__ import annotations

import os
import sys

from tqdm import tqdm


def launched_from_terminal(max_depth: int = 6) -> bool:
    """True when this process or a launcher above it writes stderr to a terminal.

    Under ``mpiexec`` a rank's stderr is a pipe to the launcher even when the
    user watches a terminal, so the parent chain (rank -> hydra proxy ->
    mpiexec) is asked too.  ``PSGD_PROGRESS=1`` or ``0`` overrides the guess.
    """
    forced = os.environ.get("PSGD_PROGRESS")
    if forced in ("0", "1"):
        return forced == "1"
    if sys.stderr.isatty():
        return True
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            return False
        try:
            target = os.readlink(f"/proc/{pid}/fd/2")
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if target.startswith(("/dev/pts/", "/dev/tty")):
            return True
    return False


def progress_bar(total: int, initial: int, enabled: bool) -> tqdm:
    """A tqdm bar over steps on stderr, disabled unless ``enabled`` and a terminal is watching."""
    show = enabled and launched_from_terminal()
    return tqdm(total=total, initial=initial, disable=not show, unit="step", dynamic_ncols=True,
                file=sys.stderr, mininterval=0.5)
