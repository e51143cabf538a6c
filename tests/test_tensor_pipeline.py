"""Pipelines of tensor-split stages (ranks = D x K x T) against serial float64 training on the
same microbatches, and the CLI's --pipeline K --tensor T."""
import pytest


def rel(out: str, what: str) -> float:
    line = next(l for l in out.splitlines() if l.startswith(what))
    return float(line.rsplit("=", 1)[1].strip().removeprefix("np.float64(").rstrip(")"))


CONV_BN = "conv:8x3:pad1-bn-relu-pool:2-conv:8x3:pad1-bn-relu-gap-dense:10"
CONV_DROP = "conv:8x3:pad1-relu-conv:6x3:pad1-relu-pool:2-flatten-dense:16-relu-dropout:0.5-dense:10"


@pytest.mark.slow
@pytest.mark.parametrize("ranks,args", [
    (4, ["mlp:20-16-16-12-10", 2, 2, 4, "1f1b", 3]),   # K=2, T=2
    (4, [CONV_BN, 2, 2, 2, "gpipe", 3]),                # stage 0 ends on split channels: gathered
    (4, [CONV_DROP, 2, 2, 3, "1f1b", 3]),               # conv pair, dense pair, dropout
    (4, ["resnet8", 2, 2, 2, "1f1b", 2]),               # residual blocks split inside
    (4, ["mlp:20-16-16-12-10", 1, 2, 2, "gpipe", 2]),   # D=2 replicas of a K=1, T=2 grid
    (2, ["mlp:20-16-16-12-10", 1, 2, 2, "1f1b", 2]),    # K=1, T=2 on 2 ranks
])
def test_tensor_split_stages_train_as_serial_float64(mpirun, ranks, args):
    proc = mpirun(ranks, ["tensor_pipeline_check.py", *args], timeout=300)
    assert rel(proc.stdout, "relative |grid - serial|") < 1e-9, proc.stdout
    assert rel(proc.stdout, "test loss relative") < 1e-9, proc.stdout
    assert rel(proc.stdout, "moved") > 1e-3, proc.stdout   # the steps changed the parameters
