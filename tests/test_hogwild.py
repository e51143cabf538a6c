"""Hogwild: no update lost (1-3 workers, 1-2 servers), reads never corrupt, bad optimizers rejected."""
import pytest

from psgd.protocols import get

SCRIPT = "hogwild_check.py"


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_hogwild_sgd_loses_no_update_and_reads_are_valid_mixes(mpirun, servers, workers):
    out = mpirun(servers + workers, [SCRIPT, servers, 40, 4099], timeout=60).stdout
    assert f"hogwild ok: S={servers} W={workers}" in out


@pytest.mark.parametrize("window", ["allocate", "create"])
def test_hogwild_general_windows_lose_no_update(mpirun, window):
    out = mpirun(3, [SCRIPT, 1, 30, 1001, "--window", window], timeout=60).stdout
    assert f"window={window}" in out


@pytest.mark.parametrize("optimizer,ranks", [("momentum", 3), ("nesterov", 2)])
def test_hogwild_local_momentum_sums_all_worker_steps(mpirun, optimizer, ranks):
    out = mpirun(ranks, [SCRIPT, 1, 30, 1001, "--optimizer", optimizer], timeout=60).stdout
    assert "hogwild ok" in out


def test_hogwild_rejects_adam_on_every_rank_with_reason(mpirun):
    out = mpirun(3, [SCRIPT, 1, 1, 10, "--optimizer", "adam"], timeout=60).stdout
    assert "rejected: optimizer 'adam'" in out and "bias correction" in out


def test_hogwild_optimizer_check_names_the_optimizer():
    hogwild = get("hogwild")
    for name in ("sgd", "momentum", "nesterov"):
        hogwild.check(optimizer=name)
    with pytest.raises(ValueError, match="'adam'.*hogwild.*bias correction"):
        hogwild.check(optimizer="adam")
    with pytest.raises(ValueError, match="--optimizer 'lamb' is not one of sgd, momentum"):
        hogwild.check(optimizer="lamb")


def test_hogwild_help_states_the_consistency_rules():
    for words in ("torn", "atomic", "no update is ever lost", "adam"):
        assert words in get("hogwild").summary


def test_a_hogwild_server_waits_for_late_workers_without_spinning_and_sees_them_finish(mpirun):
    # MPICH's blocking collectives busy-poll: a server that entered the windows' first
    # collective while its workers still imported numba took a core from them; at the end
    # the finished flags tell an idle server to poll densely for the workers' unlocks
    out = mpirun(2, ["hogwild_windows_check.py"], timeout=60).stdout
    assert "server making the windows" in out and "server sees the finished flag" in out
