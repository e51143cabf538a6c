"""Every shell block of docs/guide/ runs: page by page, in order, each page in a fresh folder.

A block is skipped only where the line before it says so: ``<!-- skip: REASON -->`` (a
cluster: sbatch, module load), or ``<!-- needs: root -->`` when the tests are not root.
Each test's id names the page and the block's number on it, so ``pytest -v`` lists and
counts the blocks run.
"""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*skip:\s*(.+?)\s*-->")
NEEDS_ROOT = re.compile(r"<!--\s*needs:\s*root\s*-->")
SHELL = ("bash", "sh", "shell")
BLOCK_TIMEOUT_S = 120


def guide_blocks(guide: Path = GUIDE) -> list[tuple[str, int, str, str | None]]:
    """(page, number on the page, code, skip reason or None) of every shell block in ``guide``."""
    found = []
    for page in sorted(guide.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        n = 0
        for m in FENCE.finditer(text):
            if m.group(1) not in SHELL:
                continue
            n += 1
            before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
            reason = None
            if SKIP.search(before):
                reason = SKIP.search(before).group(1)
            elif NEEDS_ROOT.search(before) and os.geteuid() != 0:
                reason = "needs root"
            found.append((page.name, n, m.group(2), reason))
    return found


BLOCKS = guide_blocks()


def test_the_guide_has_shell_blocks_and_no_untagged_fences():
    assert len(BLOCKS) >= 10, f"only {len(BLOCKS)} shell blocks in docs/guide"
    for page in GUIDE.glob("*.md"):
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            assert m.group(1), f"{page.name}: a fenced block without a language (bash, text, ...)"


def test_the_parser_finds_skips_and_languages(tmp_path):
    (tmp_path / "a.md").write_text("x\n\n```bash\necho 1\n```\n\n<!-- skip: needs a cluster -->\n"
                                   "```bash\nsbatch x\n```\n\n```text\nnot run\n```\n")
    assert [(p, n, c, r) for p, n, c, r in guide_blocks(tmp_path)] == [
        ("a.md", 1, "echo 1\n", None), ("a.md", 2, "sbatch x\n", "needs a cluster")]


@pytest.fixture(scope="module")
def page_dirs(tmp_path_factory):
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("page,number,code,reason", BLOCKS,
                         ids=[f"{p}#{n}" for p, n, _, _ in BLOCKS])
def test_guide_block(page, number, code, reason, page_dirs, tmp_path_factory):
    if page not in page_dirs:
        page_dirs[page] = tmp_path_factory.mktemp(page.removesuffix(".md"))
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, MPLBACKEND="Agg",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    # a session of its own, so that a block past its time leaves no rank behind
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=page_dirs[page], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{page} block {number} ran past {BLOCK_TIMEOUT_S} s:\n{code}\n"
                    f"--- output ---\n{out[-3000:]}")
    assert proc.returncode == 0, (f"{page} block {number} exited {proc.returncode}:\n{code}\n"
                                  f"--- output ---\n{out[-3000:]}")
