"""What every bench/ script shares: mpiexec, the data set, output arguments, runs, the provenance stamp."""
from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"          # --publish: the docs' results pages are made from here
RUNS = ROOT / "runs" / "bench"       # the default: git-ignored, one directory per run
FMNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION, SYNTHETIC = "Fashion-MNIST", "synthetic"
NO_DATA = "none (timed buffers, no data set)"   # what the micro-benchmarks measure on


def mpiexec() -> str:
    """The launcher: ``MPIEXEC`` (or ``PSGD_MPIEXEC``) when set; else, unless ``MPI=system``,
    the mpiexec beside this Python (``make install``'s MPICH); else the one on PATH."""
    for var in ("MPIEXEC", "PSGD_MPIEXEC"):
        if os.environ.get(var):
            return os.environ[var]
    local = Path(sys.executable).parent / "mpiexec"
    if os.environ.get("MPI") != "system" and local.exists():
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise SystemExit("bench: no mpiexec on PATH (set MPIEXEC=/path/to/mpiexec, or run "
                         "make install)")
    return found


def run_bounded(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run in its own session; on timeout SIGTERM (then SIGKILL) the whole group.

    Raises subprocess.TimeoutExpired after the group is gone.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# ---- the data set -------------------------------------------------------------------------

class Dataset(NamedTuple):
    """A benchmark's data file and the name of what is in it (FASHION or SYNTHETIC)."""

    path: Path
    name: str


def data_name(quick: bool) -> str:
    """What :func:`dataset` will use: Fashion-MNIST when installed (and not ``quick``)."""
    return FASHION if FMNIST.is_dir() and not quick else SYNTHETIC


def result_stem(base: str, quick: bool) -> str:
    """A result's file name without suffix: ``base``, with ``-synthetic`` added when the
    data is synthetic, so no name that stands for Fashion-MNIST holds synthetic results."""
    if data_name(quick) == SYNTHETIC and SYNTHETIC not in base:
        return f"{base}-{SYNTHETIC}"
    return base


def dataset(tmp: Path, quick: bool, bench: str, train: int | None = None) -> Dataset:
    """Fashion-MNIST converted to psgd's layout, or synthetic data (with a printed warning
    unless ``quick`` asked for it)."""
    out = tmp / "data.h5"
    if data_name(quick) == FASHION:
        files = {k: next(FMNIST.glob(f"{stem}*")) for k, stem in (
            ("train-images", "train-images-idx3"), ("train-labels", "train-labels-idx1"),
            ("test-images", "t10k-images-idx3"), ("test-labels", "t10k-labels-idx1"))}
        cmd = ["convert", *(x for k, f in files.items() for x in (f"--idx-{k}", str(f)))]
    else:
        if not quick:
            print(f"{bench}: WARNING: Fashion-MNIST is not installed (apt-get install "
                  f"dataset-fashion-mnist); using synthetic data, results named *-synthetic",
                  flush=True)
        n = train or (1536 if quick else 60000)
        cmd = ["synth", "--train", str(n), "--test", "256"]
    run_bounded([sys.executable, "-m", "psgd", "data", *cmd, "-o", str(out)], 300,
                cwd=ROOT).check_returncode()
    return Dataset(out, data_name(quick))


# ---- where results go ---------------------------------------------------------------------

def add_output_arguments(ap, publish_to: Path = RESULTS) -> None:
    """``--out DIR`` and ``--publish`` (see :func:`out_dir`)."""
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="write the results here (default: runs/bench/NAME-TIME/)")
    ap.add_argument("--publish", action="store_true",
                    help=f"write the results into {publish_to.relative_to(ROOT)}/, from which "
                         f"the docs' results pages are made")


def out_dir(args, name: str, publish_to: Path = RESULTS) -> Path:
    """``--out``; with ``--publish`` ``publish_to``; else ``runs/bench/<name>-<UTC time>/``.
    Made (with its parents) before any run starts."""
    if args.out and args.publish:
        raise SystemExit(f"{name}: give --out DIR or --publish, not both")
    if args.out:
        path = Path(args.out)
    elif args.publish:
        path = publish_to
    else:
        path = RUNS / f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- the provenance stamp -----------------------------------------------------------------

def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's model name (lscpu's ``Model name``, from /proc/cpuinfo)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


@functools.lru_cache(maxsize=None)
def _run_stamp() -> dict:
    """The run's commit, machine, command and start time (taken once, before it writes)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return {"commit": commit or "unknown (not a git checkout)",
            "dirty": bool(status) if status is not None else None,
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
            "command": shlex.join(["python", str(shown), *sys.argv[1:]]),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def stamp(data: str | None) -> dict:
    """The provenance every result file carries: commit (and whether the tree was dirty),
    machine (CPU model, cores), command line, UTC time and ``data`` (the data set's name, or
    what the benchmark measures on when it reads none)."""
    return {**_run_stamp(), "dataset": data}


def stamp_line(st: dict) -> str:
    """The stamp as one markdown line."""
    dirty = " (tree dirty)" if st["dirty"] else ""
    m = st["machine"]
    return (f"Commit `{st['commit'][:12]}`{dirty}; {m['cpu']}, {m['cores']} cores; "
            f"{st['utc']}; data: {st['dataset']}; `{st['command']}`")


def check_name(path: Path, data: str | None) -> None:
    """Refuse to write synthetic results under a name that does not say so."""
    if data == SYNTHETIC and SYNTHETIC not in Path(path).name:
        raise SystemExit(f"bench: refusing to write {path}: its results are from synthetic "
                         f"data, and the name stands for {FASHION} (use result_stem)")


def write_json(path: Path, payload: dict, data: str | None) -> Path:
    """``payload`` with its ``provenance`` stamp as JSON at ``path`` (atomically); earlier
    stamps of a file added to run by run are kept in ``provenance_before``."""
    from psgd.atomic_file import atomic_output
    path = Path(path)
    check_name(path, data)
    before = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
            before = old.get("provenance_before", []) + [old["provenance"]]
        except (ValueError, KeyError, AttributeError, TypeError):
            before = []
    record = {"provenance": stamp(data), **({"provenance_before": before} if before else {}),
              **{k: v for k, v in payload.items() if k not in ("provenance", "provenance_before")}}
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
    return path


def write_text(path: Path, text: str, data: str | None) -> Path:
    """A markdown result at ``path`` (atomically), its stamp as the last line."""
    from psgd.atomic_file import atomic_output
    path = Path(path)
    check_name(path, data)
    with atomic_output(path) as tmp:
        tmp.write_text(text.rstrip("\n") + "\n\n" + stamp_line(stamp(data)) + "\n")
    return path


def docs_page(name: str, title: str, about: str, body: str, files: list[Path]) -> Path:
    """docs/results/NAME.md from a published result: ``about``, the result's ``body`` (its
    table) and the stamp of the files it was written to, as a provenance table."""
    from psgd.atomic_file import atomic_output
    st = json.loads(files[0].read_text())["provenance"] if files[0].suffix == ".json" else None
    st = st or stamp(None)
    m = st["machine"]
    shown = ", ".join(f"`{f.relative_to(ROOT)}`" for f in files)
    dirty = " (with uncommitted changes)" if st["dirty"] else ""
    text = (f"# {title}\n\n{about}\n\n{body.strip()}\n\n## Provenance\n\n| | |\n|---|---|\n"
            f"| command | `{st['command']}` |\n| commit | `{st['commit']}`{dirty} |\n"
            f"| machine | {m['cpu']}, {m['cores']} cores |\n| date (UTC) | {st['utc']} |\n"
            f"| data | {st['dataset']} |\n| results | {shown} |\n")
    path = ROOT / "docs" / "results" / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        tmp.write_text(text)
    return path


def stamp_png(path: Path, data: str | None) -> Path:
    """Add the stamp to a written PNG chart as a ``tEXt`` chunk (key ``provenance``, JSON),
    after its header chunk, so the chart carries it as its JSON and markdown do."""
    import struct
    import zlib
    path = Path(path)
    check_name(path, data)
    png = path.read_bytes()
    body = b"provenance\0" + json.dumps(stamp(data)).encode("latin-1", "replace")
    chunk = (struct.pack(">I", len(body)) + b"tEXt" + body
             + struct.pack(">I", zlib.crc32(b"tEXt" + body) & 0xFFFFFFFF))
    end_of_ihdr = 8 + 4 + 4 + 13 + 4            # signature, IHDR's length, type, data, crc
    from psgd.atomic_file import atomic_output
    with atomic_output(path) as tmp:
        tmp.write_bytes(png[:end_of_ihdr] + chunk + png[end_of_ihdr:])
    return path
