"""Sparse hogwild: only touched rows are accumulated, no update lost, lazy decay equal to eager."""
import pytest

SCRIPT = "sparse_hogwild_check.py"


@pytest.mark.parametrize("servers, workers", [(1, 1), (1, 2), (2, 3)])
def test_sparse_hogwild_loses_no_update(mpirun, servers, workers):
    out = mpirun(servers + workers, [SCRIPT, servers, 30, 101, 3], timeout=60).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out


def test_sparse_hogwild_lazy_decay_equals_eager(mpirun):
    out = mpirun(3, [SCRIPT, 2, 40, 50, 4, "--decay", "0.1"], timeout=60).stdout
    assert "sparse hogwild ok: S=2 W=1 decay=0.1" in out
