"""Model parallelism inside a layer: the primitives' adjoint tests and split layers against serial."""
import pytest

NAMES = ["copy", "allreduce", "allgather", "split", "reduce_scatter", "scatter", "gather", "halo"]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_primitive_passes_the_adjoint_test_float64(mpirun, n):
    out = mpirun(n, ["tensor_adjoint.py"], timeout=120).stdout
    for name in NAMES:
        assert f"adjoint ok {name} ranks={n}" in out, out
