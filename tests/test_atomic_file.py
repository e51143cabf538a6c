"""The atomic file write: the new file appears whole or not at all, with an ordinary file's mode."""
import os
import stat

import pytest

from psgd.atomic_file import atomic_output


def test_success_replaces_the_file_and_leaves_no_temp(tmp_path):
    out = tmp_path / "f.bin"
    out.write_bytes(b"old")
    with atomic_output(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".f.bin.") and tmp.name.endswith(".tmp")
        tmp.write_bytes(b"new")
        assert out.read_bytes() == b"old"          # not replaced before the block ends
    assert out.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_written_file_gets_the_mode_of_a_new_file_under_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_output(tmp_path / "f.bin") as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.bin").stat().st_mode) == 0o640   # mkstemp alone gives 0600


def test_error_in_the_block_keeps_the_old_file_and_removes_the_temp(tmp_path):
    out = tmp_path / "f.bin"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic_output(out) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("midway")
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_prefix_and_suffix_name_the_temp_file(tmp_path):
    with atomic_output(tmp_path / "ckpt-1.h5", prefix=".ckpt-", suffix=".h5.tmp") as tmp:
        assert list(tmp_path.glob(".ckpt-*.h5.tmp")) == [tmp]
        tmp.write_bytes(b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-1.h5"]
