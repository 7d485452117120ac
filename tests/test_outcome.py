"""The report of a failed run leads with the root cause: the first failure in time that
clusterrun's own teardown did not cause, in time measured without trusting any host's clock."""

from __future__ import annotations

import itertools
from typing import Optional

import pytest

from clusterrun.inventory.ranges import fold
from clusterrun.launch import outcome
from clusterrun.launch.outcome import Clock
from clusterrun.launch.watchers import Fold
from clusterrun.plan.model import NodePlan
from clusterrun.runs.state import exit_status, from_outcome
from clusterrun.wire import End, RankExit, RootCause, Started, TorchrunExit


def node(name: str, rank: int, *, handshake: float = 0.0, elapsed: float = 0.0
         ) -> outcome.NodeOutcome:
    """A node whose supervisor's first frame arrived at ``handshake`` (this machine's monotonic
    clock) saying it had been up ``elapsed`` seconds."""
    plan = NodePlan(name=name, host=name, local=False, node_rank=rank, nproc=2,
                    first_rank=2 * rank, interface="eth0", address="", python="python3",
                    setup=None, workdir="/w", rundir="/w/r", cwd="/w/c", argv=(), env=())
    return outcome.NodeOutcome(plan, started=Started(elapsed),
                               clock=Clock.handshake(handshake, elapsed))


def status(root: Optional[RootCause], interrupted: Optional[int], stopped: bool) -> int:
    """The exit status of a watched run with this root cause (runs.state, as launch uses it)."""
    state = from_outcome(root_lost=None if root is None else root.lost,
                         interrupted=interrupted is not None, stopped=stopped)
    return exit_status(state, root, interrupted)


def ended(n: outcome.NodeOutcome, state: str, code: Optional[int],
          reason: Optional[str] = None) -> outcome.NodeOutcome:
    n.end = End(0.0, state, exit_code=code, reason=reason)
    return n


def test_first_failure_in_time_is_the_root_cause_and_teardown_exits_are_not() -> None:
    a, b, c = node("a", 0), node("b", 1), node("c", 2)
    b.rank_exits[3] = RankExit(100.0, 3, 3, False)
    a.rank_exits[0] = RankExit(100.5, 0, 1, False)  # its peer vanished: a consequence
    c.rank_exits[5] = RankExit(99.0, 5, 143, True)  # stopped by us: not a cause
    found = outcome.failures([a, b, c])
    assert [f.detail for f in found] == ["b rank 3 exited with code 3",
                                         "a rank 0 exited with code 1"]
    assert status(found[0], None, False) == 3


@pytest.mark.parametrize(("a_fails_at", "first"), [(11.5, "a"), (12.5, "b")])
def test_skewed_clocks_and_any_arrival_order_give_the_same_root_cause(
        a_fails_at: float, first: str) -> None:
    """Each event counts seconds since its own supervisor started; the hosts' wall clocks
    (minutes apart) are never read. b's supervisor started 10 s after a's (by when their first
    frames arrived here), and b's rank fails 2.0 s into b's life: at a's 12.0 s. So a's rank
    failing at a's 11.5 s came first, at 12.5 s it came second, whatever order the events
    arrive in."""
    events = [("a", RankExit(a_fails_at, 0, 1, False)), ("b", RankExit(2.0, 2, 3, False)),
              ("c", RankExit(0.7, 4, 143, True)), ("c", TorchrunExit(0.9, 1, True)),
              ("b", TorchrunExit(2.4, 1, False))]
    for order in itertools.permutations(events):
        # First frames: a's arrived at 1000.0 after 0.1 s of its life; b's at 1010.05 after
        # 0.05 s (so b started 10 s after a); c's at 1011.0 after 0.2 s.
        nodes = {"a": node("a", 0, handshake=1000.0, elapsed=0.1),
                 "b": node("b", 1, handshake=1010.05, elapsed=0.05),
                 "c": node("c", 2, handshake=1011.0, elapsed=0.2)}
        for name, ev in order:
            if isinstance(ev, RankExit):
                nodes[name].rank_exits[ev.rank] = ev
            else:
                nodes[name].torchrun_exit = ev
        found = outcome.failures(list(nodes.values()))
        assert found[0].node == first, order
        assert {f.node: f.t for f in found} == pytest.approx({"a": 999.9 + a_fails_at,
                                                              "b": 1012.0})


def test_a_lost_node_is_placed_on_this_machines_own_clock() -> None:
    a = node("a", 0, handshake=50.0, elapsed=0.0)
    a.rank_exits[1] = RankExit(5.0, 1, 137, False)  # at 55.0 here
    b = node("b", 1, handshake=10_000.0, elapsed=9_000.0)  # a wildly different count
    b.lost, b.lost_at = "no word from it for 31 s", 54.0
    found = outcome.failures([a, b])
    assert [f.node for f in found] == ["b", "a"]
    assert found[1].detail == "a rank 1 was killed by signal 9 (SIGKILL)"
    assert found[1].signal == 9
    assert status(found[0], None, False) == 5


def test_signals_lost_nodes_and_interrupts_map_to_documented_statuses() -> None:
    b = node("b", 1)
    b.lost, b.lost_at = "no word from it for 31 s", 1.0
    root = outcome.failures([b])[0]
    assert status(root, None, False) == 5
    assert status(root, 2, False) == 130
    assert status(None, 15, True) == 143
    assert status(None, None, False) == 0


def test_torchrun_failure_without_a_rank_failure_is_reported() -> None:
    a = node("a", 0)
    a.torchrun_exit = TorchrunExit(2.0, 1, False)
    assert outcome.failures([a])[0].detail == "a: torchrun exited with code 1"


def test_the_footer_groups_nodes_by_what_happened_to_them(tmp_path) -> None:
    from clusterrun.runs.store import RunDir

    a, b, c, d = node("node1", 0), node("node2", 1), node("node3", 2), node("node4", 3)
    b.rank_exits[3] = RankExit(1.0, 3, 3, False)
    ended(b, "failed", 3, "node2 rank 3 exited with code 3")
    for n in (a, c):
        ended(n, "stopped", 143, "stopped after node2 rank 3 exited with code 3")
    d.rank_exits[6] = RankExit(1.5, 6, 1, False)  # its peer vanished first
    ended(d, "failed", 1)
    a.folded, c.folded = 25, 27
    root = outcome.failures([a, b, c, d])[0]
    run = RunDir(tmp_path / "run-1")
    lines = outcome.report(run, [a, b, c, d], root, None, True)
    assert lines[0] == "root cause: node2 rank 3 exited with code 3"
    assert "node[1,3]: stopped after node2 failed" in lines
    assert "node2: failed (rank 3 exited with code 3)" in lines
    assert "node4: failed after node2 failed (rank 6 exited with code 1)" in lines
    assert lines[-1].startswith("torchrun's shutdown output (tracebacks, closing signals) "
                                "folded for node[1,3]")
    summary = outcome.summary(run, [a, b, c, d], root=root, status=3, interrupted=None,
                              checks={}).to_json()
    by_name = {n["name"]: n for n in summary["nodes"]}
    assert (by_name["node2"]["state"], by_name["node2"]["exit_code"]) == ("failed", 3)
    assert by_name["node1"]["outcome"] == "stopped after node2 failed"
    assert summary["root_cause"] == {"node": "node2", "rank": 3, "code": 3, "signal": None,
                                     "detail": "node2 rank 3 exited with code 3",
                                     "lost": False}


class Recorder:
    def __init__(self) -> None:
        self.fed: list[tuple[str, str, bytes]] = []

    def feed(self, node: str, file: str, data: bytes) -> None:
        self.fed.append((node, file, data))


def test_torchruns_teardown_output_is_folded_and_rank_output_is_not() -> None:
    nodes = {"n1": node("n1", 0), "n2": node("n2", 1)}
    view = Recorder()
    folding = Fold(view, nodes)  # type: ignore[arg-type]
    folding.feed("n1", "node.log", b"torchrun starting\npart")
    folding.feed("n1", "node.log", b"ial\nW1122 Sending process 42 closing signal SIGTERM\n"
                 b"Traceback (most recent call last):\n  File x\n")
    folding.feed("n1", "rank-0.log", b"rank output stays\n")
    folding.hush("n2")
    folding.feed("n2", "node.log", b"torch.distributed.elastic.multiprocessing.errors."
                 b"ChildFailedError:\n")
    folding.close()
    shown = b"".join(d for n, f, d in view.fed if f == "node.log")
    assert shown == b"torchrun starting\npartial\n"
    assert ("n1", "rank-0.log", b"rank output stays\n") in view.fed
    assert (nodes["n1"].folded, nodes["n2"].folded) == (3, 1)


def test_fold_names_host_sets_like_pdsh() -> None:
    assert fold(["node3", "node1", "node2", "node7", "gpu-a"]) == "gpu-a,node[1-3,7]"
    assert fold(["n01", "n02", "n03"]) == "n[01-03]"
    assert fold(["solo"]) == "solo"


def test_a_stopped_stall_shows_the_blamed_ranks_last_lines_not_torchruns_stop(tmp_path) -> None:
    """The node log of a node a stall stop failed holds torchrun's SIGTERM traceback; the
    root cause's last lines are the blamed rank's own, or none where no rank stood out."""
    from clusterrun.runs.store import RunDir

    run = RunDir(tmp_path / "run-1")
    for name, text in (("node.log", "torch...SignalException: Process 1 got signal: 15\n"),
                       ("rank-3.log", "epoch 0 step 0 loss 0.720\n")):
        path = run.mirror("node2", name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    odd = RootCause("node2", None, 7, "node2: stalled, odd one out: rank 3 on node2 (pid 9) in "
                    "<module> (train.py:19); last line: 'epoch 0 step 0 loss 0.720'")
    lines = outcome.report(run, [], odd, None, True)
    assert lines[1:] == ["  last lines of [node2 r3]:", "    epoch 0 step 0 loss 0.720"], lines
    alike = RootCause("node2", None, 7, "node2: stalled, no rank made progress for 15 s; "
                      "6 ranks, 1 different stack")
    assert outcome.report(run, [], alike, None, True) == [f"root cause: {alike.detail}"]
    failed = RootCause("node2", None, 1, "node2: torchrun exited with code 1")
    assert "SignalException" in outcome.report(run, [], failed, None, True)[-1]
