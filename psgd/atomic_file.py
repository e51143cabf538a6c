"""Writing a file atomically: a temp file beside it, fsync, rename over it, fsync of the directory."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_output(path: str | os.PathLike, prefix: str | None = None,
                  suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temp path beside ``path``; when the block ends without error, make it ``path``.

    The caller writes the temp file; on success it gets the permissions of a
    new file under the umask, is fsynced and renamed over ``path``, and the
    directory is fsynced. A crash leaves either the old ``path`` or the new
    one, never half of one. On any exception the temp file is removed and
    ``path`` is left untouched.

    Parameters
    ----------
    path : path-like
        The final file; its directory must exist.
    prefix, suffix : str
        Temp file name ``prefix + random + suffix``; ``prefix`` defaults to
        ``"." + path.name + "."``, so the temp file is hidden.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}." if prefix is None else prefix,
                                suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _chmod_as_new_file(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _chmod_as_new_file(path: Path) -> None:
    """mkstemp makes 0600; give the file the mode ``open()`` would (0666 under the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; skipped where the file system cannot open or fsync a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
