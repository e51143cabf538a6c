"""Build a real text corpus from this machine's man pages: train/<section>/*.txt and test/<section>/*.txt.

    .venv/bin/python bench/text_corpus.py OUT_FOLDER [--seed 0] [--test-fraction 0.3]

Each English man page of sections 1, 2, 3, 5, 7 and 8 (/usr/share/man/manN/*.gz; links,
``.so`` stubs and the 16k generated gcloud pages left out) is stripped of troff and cut at
its ``.SH`` headings; every part of at least 20 words is one document, labelled by the
page's section. A page goes whole to test when the crc32 of ``seed:name`` falls in the
test fraction, so no page has parts on both sides. ``psgd data text OUT_FOLDER`` then
vectorises it.
"""
from __future__ import annotations

import argparse
import gzip
import re
import shutil
import zlib
from pathlib import Path

SECTIONS = ("1", "2", "3", "5", "7", "8")
MAN = Path("/usr/share/man")
ESCAPE = re.compile(r"\\(?:f(?:\[[^]]*\]|\(..|.)|\(..|\[[^]]*\]|\*(?:\(..|\[[^]]*\]|.)|s[-+]?\d+|.)")
MIN_WORDS = 20


def strip_troff(text: str) -> list[str]:
    """The page's parts, cut at ``.SH``, as plain text (request names and escapes removed)."""
    parts, lines = [], []
    for line in text.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if line.startswith((".SH", ".Sh")) and lines:
            parts.append(" ".join(lines))
            lines = []
        if line.startswith((".", "'")):
            words = line.split(None, 1)
            line = words[1] if len(words) > 1 else ""
        lines.append(ESCAPE.sub(" ", line))
    parts.append(" ".join(lines))
    return [p for p in parts if len(p.split()) >= MIN_WORDS]


def pages(section: str):
    for path in sorted((MAN / f"man{section}").glob("*.gz")):
        if path.is_symlink() or path.name.startswith("gcloud"):
            continue
        try:
            text = gzip.open(path, "rt", errors="replace").read()
        except (OSError, EOFError):
            continue
        if text.lstrip().startswith(".so "):
            continue
        yield path.name[:-3], text


def build(out: Path, seed: int, test_fraction: float) -> dict:
    if out.exists():
        shutil.rmtree(out)
    counts = {}
    for section in SECTIONS:
        for name, text in pages(section):
            split = "test" if zlib.crc32(f"{seed}:{name}".encode()) % 1000 < test_fraction * 1000 \
                else "train"
            folder = out / split / f"man{section}"
            folder.mkdir(parents=True, exist_ok=True)
            for i, part in enumerate(strip_troff(text)):
                (folder / f"{name}.{i}.txt").write_text(part)
                counts[split] = counts.get(split, 0) + 1
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.3)
    args = p.parse_args()
    print(build(args.out, args.seed, args.test_fraction))


if __name__ == "__main__":
    main()
