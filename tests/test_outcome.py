"""The report of a failed run leads with the root cause: the first failure in time that
clusterrun's own teardown did not cause."""

from __future__ import annotations

from clusterrun.launch import outcome
from clusterrun.plan.model import NodePlan
from clusterrun.transport.parallel import fold


def node(name: str, rank: int) -> outcome.NodeOutcome:
    plan = NodePlan(name=name, host=name, local=False, node_rank=rank, nproc=2,
                    first_rank=2 * rank, interface="eth0", address="", python="python3",
                    setup=None, workdir="/w", rundir="/w/r", cwd="/w/c", argv=(), env=())
    return outcome.NodeOutcome(plan, started=True)


def test_first_failure_in_time_is_the_root_cause_and_teardown_exits_are_not() -> None:
    a, b, c = node("a", 0), node("b", 1), node("c", 2)
    b.rank_exits[3] = {"code": 3, "t": 100.0}
    a.rank_exits[0] = {"code": 1, "t": 100.5}  # its peer vanished: a consequence
    c.rank_exits[5] = {"code": 143, "t": 99.0, "stopping": True}  # stopped by us: not a cause
    found = outcome.failures([a, b, c])
    assert [f.detail for f in found] == ["b rank 3 exited with code 3",
                                         "a rank 0 exited with code 1"]
    assert outcome.exit_status(found[0], None, False) == 3


def test_signals_lost_nodes_and_interrupts_map_to_documented_statuses() -> None:
    a = node("a", 0)
    a.rank_exits[1] = {"code": 137, "t": 5.0}
    assert outcome.failures([a])[0].detail == "a rank 1 was killed by signal 9 (SIGKILL)"
    b = node("b", 1)
    b.lost, b.lost_at = "no word from it for 31 s", 1.0
    root = outcome.failures([a, b])[0]
    assert root.node == "b" and outcome.exit_status(root, None, False) == 5
    assert outcome.exit_status(root, 2, False) == 130
    assert outcome.exit_status(None, 15, True) == 143
    assert outcome.exit_status(None, None, False) == 0


def test_torchrun_failure_without_a_rank_failure_is_reported() -> None:
    a = node("a", 0)
    a.torchrun_exit = {"code": 1, "t": 2.0}
    assert outcome.failures([a])[0].detail == "a: torchrun exited with code 1"


def test_fold_names_host_sets_like_pdsh() -> None:
    assert fold(["node3", "node1", "node2", "node7", "gpu-a"]) == "gpu-a,node[1-3,7]"
    assert fold(["n01", "n02", "n03"]) == "n[01-03]"
    assert fold(["solo"]) == "solo"
