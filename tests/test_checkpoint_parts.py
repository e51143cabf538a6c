"""Checkpoints written in parts: a manifest over part files reads as the one-file checkpoint
of the joined vectors; a set without its manifest, or missing a part, is never a checkpoint."""
import numpy as np
import pytest

from psgd.errors import UsageError
from psgd.run.checkpoint import (Checkpoint, list_checkpoints, load_checkpoint, resume_path,
                                 save_checkpoint)
from psgd.run.checkpoint_parts import part_name, save_manifest, save_part

CUT = [0, 5, 12, 20]   # three parts of a 20-value vector


def _state(seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(20).astype(np.float32), rng.standard_normal(20).astype(np.float32)


def _write_set(d, step: int, seed: int = 0, manifest: bool = True, run_id: str = "r1"):
    """Each part written on its own, as a stage would; stage 0's optimizer has stepped 7 times,
    the others 9 (servers of different stages step apart under asp)."""
    params, velocity = _state(seed)
    parts = []
    for i, (lo, hi) in enumerate(zip(CUT, CUT[1:])):
        steps = 7 if i == 0 else 9
        save_part(d, step, i, params[lo:hi], {"velocity": velocity[lo:hi], "steps": steps})
        parts.append((lo, hi, steps))
    if manifest:
        ckpt = Checkpoint(params=np.empty(0, np.float32), model_spec="mlp:4-4", step=step,
                          optimizer="momentum", opt_state={"steps": 7}, run_id=run_id)
        save_manifest(d, ckpt, parts, ["velocity"])
    return params, velocity


def test_a_manifest_reads_as_the_joined_vectors_whole_and_by_part(tmp_path):
    params, velocity = _write_set(tmp_path, 4)
    whole = load_checkpoint(tmp_path / "ckpt-00000004.h5")
    np.testing.assert_array_equal(whole.params, params)
    np.testing.assert_array_equal(whole.opt_state["velocity"], velocity)
    assert whole.step == 4 and whole.model_spec == "mlp:4-4" and whole.opt_state["steps"] == 7
    part = load_checkpoint(tmp_path / "ckpt-00000004.h5", (5, 12))
    np.testing.assert_array_equal(part.params, params[5:12])
    np.testing.assert_array_equal(part.opt_state["velocity"], velocity[5:12])
    assert part.opt_state["steps"] == 9   # its own part's optimizer steps
    across = load_checkpoint(tmp_path / "ckpt-00000004.h5", (3, 15))   # another cut
    np.testing.assert_array_equal(across.params, params[3:15])


def test_a_set_without_its_manifest_or_with_a_missing_part_is_skipped(tmp_path):
    _write_set(tmp_path, 4, seed=1)
    _write_set(tmp_path, 8, seed=2, manifest=False)   # killed before the manifest
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000004.h5"]
    _write_set(tmp_path, 8, seed=2)
    assert resume_path("auto", tmp_path).name == "ckpt-00000008.h5"
    (tmp_path / part_name(8, 1)).unlink()   # a manifest naming a missing part
    assert resume_path("auto", tmp_path).name == "ckpt-00000004.h5"
    with pytest.raises(UsageError, match="part ckpt-00000008.part-001.h5 is missing"):
        load_checkpoint(tmp_path / "ckpt-00000008.h5")


def test_a_new_manifest_drops_orphaned_parts_and_pruned_sets_take_their_parts(tmp_path):
    _write_set(tmp_path, 2, manifest=False)   # orphans of a cut-off set
    for step in (4, 8, 12, 16):
        _write_set(tmp_path, step, seed=step)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f"ckpt-{s:08d}.h5" for s in (8, 12, 16)]
                           + [part_name(s, i) for s in (8, 12, 16) for i in range(3)])


def test_one_file_checkpoints_and_manifests_prune_together(tmp_path):
    """A run that goes on as data parallelism after a pipeline keeps the newest three of both."""
    _write_set(tmp_path, 4)
    for step in (8, 12, 16):
        save_checkpoint(tmp_path, Checkpoint(params=np.zeros(20, np.float32), model_spec="mlp:4-4",
                                             step=step, run_id="r1"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ckpt-{s:08d}.h5" for s in (8, 12, 16)]
