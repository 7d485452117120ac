"""The node supervisor (clusterrun/remote/node/run.py and exec.py) through the local transport: no
root, no sshd. Each test starts the real program the way the controller does (the bootstrap
command line, the program and its request on stdin) and asserts on its events, its state file
and the processes left on this machine."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from clusterrun import wire
from clusterrun.transport import shell
from tests.conftest import Remote, state_of, wait_gone

# The stand-in torchrun below never stops a failed rank's peers itself, as torchrun does: the
# supervisor does it after this long (5 s on a real run), which these tests would wait out.
FAILURE_TEARDOWN = 0.5


def wait_for_file(path: Path, timeout: float = 30) -> None:
    """Until a rank has written ``path``: what it did before that has happened."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def run_request(tmp_path: Path, mark: str, ranks: dict[int, str], *, launcher: str = "",
                detach: bool = False, grace: float = 2, lease: float = 10,
                gang: Optional[dict[str, Any]] = None, node: str = "n0") -> dict[str, Any]:
    """A stand-in for torchrun: a shell script that starts each rank under rank.sh (as torchrun
    does) and then waits for them, or runs ``launcher`` after starting them."""
    rundir = tmp_path / node / "run"
    lines = [f"RANK={r} /bin/sh {rundir}/rank.sh /bin/sh -c {shell.join([cmd])} &"
             for r, cmd in ranks.items()]
    script = "\n".join([*lines, launcher or "wait"])
    req = {"node": node, "rundir": str(rundir), "cwd": str(tmp_path),
           "argv": ["/bin/sh", "-c", script], "env": {"CLUSTERRUN_TEST_MARK": mark},
           "public": {"name": node}, "detach": detach, "grace": grace, "lease": lease,
           "heartbeat": 0.5, "failure_teardown": FAILURE_TEARDOWN}
    if gang is not None:
        req["gang"] = gang
    return req


def test_a_failing_rank_is_the_nodes_own_failure(tmp_path: Path, mark: str) -> None:
    req = run_request(tmp_path, mark, {0: "sleep 0.3; echo last words; exit 3",
                                       1: "sleep 100"}, launcher="wait $!")
    remote = Remote("run.py", req)
    started = remote.wait_for(wire.Started)
    assert started.subreaper and started.torchrun_pid
    # The stand-in torchrun does not stop rank 1 itself: the supervisor does, as its own
    # failure's teardown, and the node still reports its rank's failure, not a stop.
    end = remote.end(timeout=30)
    assert end.state == "failed" and end.exit_code == 3
    assert end.reason == "n0 rank 0 exited with code 3"
    exits = {e.rank: e for e in remote.events if isinstance(e, wire.RankExit)}
    assert exits[0].code == 3 and not exits[0].stopping
    assert remote.data["rank-0.log"] == b"last words\n"
    state = state_of(req)
    assert state["state"] == "failed" and state["exit_code"] == 3 and state["ended_at"]
    assert state["cause"] == "rank_failed"
    for key in ("supervisor_pid", "supervisor_start", "torchrun_pid", "torchrun_start",
                "started_at", "ranks", "checksums", "reason"):
        assert key in state, key
    assert state["checksums"]["rank-0.log"][0] == len(b"last words\n")
    assert wait_gone(mark, 10) == []


def test_peers_the_launcher_ended_are_recorded_but_never_the_cause(
        tmp_path: Path, mark: str) -> None:
    """As torchrun does when a rank fails: the other local ranks' process groups get SIGTERM.
    Their rank.sh records the exit (143) marked as ended by the launcher, so the root cause
    stays the rank that failed even when both exits are seen in one look."""
    rundir = tmp_path / "n0" / "run"
    rank = f"/bin/sh {rundir}/rank.sh /bin/sh -c"
    script = (f"RANK=0 setsid {rank} 'sleep 100' & r0=$!\n"
              f"RANK=1 {rank} 'sleep 0.5; exit 5' & r1=$!\n"
              "wait $r1; kill -TERM -- -$r0; wait $r0; exit 1")
    req = {"node": "n0", "rundir": str(rundir), "cwd": str(tmp_path),
           "argv": ["/bin/sh", "-c", script], "env": {"CLUSTERRUN_TEST_MARK": mark},
           "public": {"name": "n0"}, "detach": False, "grace": 2, "lease": 10, "heartbeat": 0.5,
           "failure_teardown": FAILURE_TEARDOWN}
    remote = Remote("run.py", req)
    end = remote.end(timeout=30)
    assert (end.state, end.exit_code, end.reason) == ("failed", 5, "n0 rank 1 exited with code 5")
    exits = {e.rank: e for e in remote.events if isinstance(e, wire.RankExit)}
    assert (exits[1].code, exits[1].stopping) == (5, False)
    assert (exits[0].code, exits[0].stopping) == (128 + signal.SIGTERM, True)
    assert (rundir / "rank-0.exit").read_text() == "143 stopped\n"
    assert wait_gone(mark, 10) == []


def test_a_rank_killed_alone_by_sigterm_is_the_cause(tmp_path: Path, mark: str) -> None:
    req = run_request(tmp_path, mark, {0: "sleep 0.3; kill -TERM $$", 1: "sleep 100"},
                      launcher="wait $!")
    end = Remote("run.py", req).end(timeout=30)
    assert (end.state, end.exit_code) == ("failed", 128 + signal.SIGTERM)
    assert end.reason == "n0 rank 0 was killed by signal 15 (SIGTERM)"
    assert (tmp_path / "n0" / "run" / "rank-0.exit").read_text() == "143\n"
    assert wait_gone(mark, 10) == []


def test_stop_after_its_own_failure_still_reports_failed(tmp_path: Path, mark: str) -> None:
    """The controller tells every node to stop, the failing one included: it stays failed."""
    req = run_request(tmp_path, mark, {2: "exit 3"}, launcher="wait; sleep 100")
    remote = Remote("run.py", req)
    remote.wait_for(wire.RankExit)
    remote.send(op="stop", reason="stopped after n0 rank 2 exited with code 3")
    end = remote.end()
    assert (end.state, end.exit_code) == ("failed", 3)
    assert wait_gone(mark, 10) == []


def test_a_stop_request_ends_it_within_the_grace_period(tmp_path: Path, mark: str) -> None:
    """A rank that ignores SIGTERM is SIGKILLed once the grace period is over."""
    ignoring = tmp_path / "ignoring-term"
    req = run_request(tmp_path, mark, {0: f"trap '' TERM; : > {ignoring}; sleep 100"}, grace=1)
    remote = Remote("run.py", req)
    remote.wait_for(wire.Started)
    wait_for_file(ignoring)  # the trap is in place: the stop cannot end the rank by SIGTERM
    asked = time.monotonic()
    remote.send(op="stop")
    end = remote.end()
    took = time.monotonic() - asked
    assert 1 <= took < 1 + 10  # the grace, then SIGKILL; not the job's `sleep 100`
    assert end.state == "stopped" and end.cause == "controller"
    assert end.reason == "stopped by the controller"
    # SIGKILL took rank.sh too: no exit file, so nothing that could pass for a failure.
    assert not (Path(req["rundir"]) / "rank-0.exit").exists()
    assert all(e.stopping for e in remote.events if isinstance(e, wire.RankExit))
    assert state_of(req)["state"] == "stopped"
    assert wait_gone(mark, 5) == []


def test_lifeline_eof_ends_the_run(tmp_path: Path, mark: str) -> None:
    req = run_request(tmp_path, mark, {0: "sleep 100", 1: "sleep 100"})
    remote = Remote("run.py", req)
    remote.wait_for(wire.Started)
    remote.proc.close_stdin()  # what sshd does when the controller's connection drops
    end = remote.end()
    assert end.state == "lost" and end.cause == "lifeline_eof"
    assert "lifeline lost" in (end.reason or "")
    assert wait_gone(mark, 5) == []


def test_missed_heartbeats_end_the_run_after_the_lease(tmp_path: Path, mark: str) -> None:
    req = run_request(tmp_path, mark, {0: "sleep 100"}, lease=1.5)
    remote = Remote("run.py", req)
    remote.wait_for(wire.Started)
    end = remote.end()
    assert end.state == "lost" and end.cause == "lease_expired"
    assert "no heartbeat" in (end.reason or "")
    assert wait_gone(mark, 5) == []


def test_sigterm_and_what_the_job_left_behind(tmp_path: Path, mark: str) -> None:
    """A daemon a rank double-forked cannot escape: the supervisor is a subreaper."""
    daemon = tmp_path / "daemon.pid"
    req = run_request(tmp_path, mark, {
        0: f"(setsid sh -c 'echo $$ > {daemon}.new; mv {daemon}.new {daemon}; exec sleep 100' &)"
           "; sleep 100"})
    remote = Remote("run.py", req)
    started = remote.wait_for(wire.Started)
    wait_for_file(daemon)  # it has left the rank's session: the case this test is about
    assert os.getsid(int(daemon.read_text())) == int(daemon.read_text())  # its own session
    os.kill(started.pid, signal.SIGTERM)
    end = remote.end()
    assert end.state == "stopped" and end.cause == "signal"
    assert "SIGTERM" in (end.reason or "")
    assert wait_gone(mark, 5) == []  # the daemon carries the mark too


def test_exec_times_out_and_streams_both_outputs_apart(tmp_path: Path, mark: str) -> None:
    remote = Remote("command.py", {"command": f"export CLUSTERRUN_TEST_MARK={mark}; echo out; "
                                           "echo err >&2; sleep 100", "timeout": 1,
                                "grace": 1, "lease": 10, "heartbeat": 0.5})
    end = remote.end()
    assert end.state == "timeout" and end.cause == "timeout"
    assert remote.data == {"stdout": b"out\n", "stderr": b"err\n"}
    assert wait_gone(mark, 5) == []


def test_exec_reports_the_exit_status_and_ends_background_jobs(tmp_path: Path, mark: str) -> None:
    remote = Remote("command.py", {"command": f"export CLUSTERRUN_TEST_MARK={mark}; "
                                           "(sleep 100 &); exit 7", "lease": 10})
    end = remote.end()
    assert (end.state, end.exit_code) == ("exited", 7)
    assert wait_gone(mark, 5) == []


def test_exec_ends_on_lifeline_eof(tmp_path: Path, mark: str) -> None:
    remote = Remote("command.py", {"command": f"export CLUSTERRUN_TEST_MARK={mark}; sleep 100",
                                "lease": 10, "grace": 1})
    remote.wait_for(wire.Started)
    remote.proc.close_stdin()
    assert remote.end().state == "lost"
    assert wait_gone(mark, 5) == []


# ------------------------------------------------------------------ detached gangs


def start_gang(tmp_path: Path, mark: str, hub_ranks: dict[int, str],
               peer_ranks: dict[int, str], *, peer_secret: str = "s3cret",
               lease: float = 3, start_within: float = 30) -> tuple[dict, dict, wire.Started]:
    hub_req = run_request(tmp_path, mark, hub_ranks, detach=True, lease=lease, node="n0",
                          gang={"role": "hub", "secret": "s3cret", "peers": ["n1"],
                                "addr": "127.0.0.1", "port": None,
                                "start_within": start_within})
    hub = Remote("run.py", hub_req)
    started = hub.wait_for(wire.Started)
    assert started.hub_port
    peer_req = run_request(tmp_path, mark, peer_ranks, detach=True, lease=lease, node="n1",
                           gang={"role": "peer", "secret": peer_secret, "hub_node": "n0",
                                 "addr": "127.0.0.1", "port": started.hub_port})
    Remote("run.py", peer_req).wait_for(wire.Started)
    return hub_req, peer_req, started


def wait_ended(req: dict[str, Any], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = state_of(req)
        if state.get("ended_at"):
            return state
        time.sleep(0.1)
    raise AssertionError(f"{req['node']} did not end: {state_of(req)}")


def wait_state(req: dict[str, Any], ready: Callable[[dict[str, Any]], bool]) -> None:
    """Until the node's state.json shows what ``ready`` wants (bounded only against a hang)."""
    deadline = time.monotonic() + 60
    while not ready(state_of(req)):
        assert time.monotonic() < deadline, state_of(req)
        time.sleep(0.05)


def test_detached_gang_stops_everyone_when_a_worker_fails(tmp_path: Path, mark: str) -> None:
    hub_req, peer_req, _ = start_gang(tmp_path, mark, {0: "sleep 100", 1: "sleep 100"},
                                      {2: "sleep 1; exit 3", 3: "sleep 100"})
    peer = wait_ended(peer_req, 15)
    hub = wait_ended(hub_req, 15)
    assert (peer["state"], peer["exit_code"]) == ("failed", 3)
    assert hub["state"] == "stopped" and hub["cause"] == "peer_failed"
    for state in (hub, peer):
        root = state["root_cause"]
        assert (root["node"], root["rank"], root["code"]) == ("n1", 2, 3), state
        assert root["detail"] == "n1 rank 2 exited with code 3"
    assert hub["peers"] == {"n1": "ended"}
    assert wait_gone(mark, 10) == []


def test_detached_gang_loses_a_crashed_worker(tmp_path: Path, mark: str) -> None:
    hub_req, peer_req, _ = start_gang(tmp_path, mark, {0: "sleep 100"}, {1: "sleep 100"})
    wait_state(hub_req, lambda state: (state.get("peers") or {}).get("n1") == "connected")
    deadline = time.monotonic() + 60  # and its rank is running: only against a hang
    while not any(_cmdline(pid) == b"sleep\x00100\x00" for pid in _tree_of(peer_req)):
        assert time.monotonic() < deadline, "the worker's rank never started"
        time.sleep(0.05)
    # The worker's host crashes: everything of it dies at once. Frozen first, so that no
    # process of it sees another die (a supervisor that outlives its rank by a moment tells
    # the hub of the rank's failure: not a crash).
    tree = _tree_of(peer_req)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):  # one that exited since it was listed
                os.kill(pid, sig)
    hub = wait_ended(hub_req, 15)
    assert hub["state"] == "stopped" and hub["cause"] == "peer_lost"
    assert hub["root_cause"]["node"] == "n1" and hub["root_cause"]["lost"]
    # Lost once connected, not "never reached the master" after start_within (another path).
    assert hub["root_cause"]["detail"] == "n1 was lost: its connection to the master closed"
    assert wait_gone(mark, 10) == []


def test_detached_peer_with_the_wrong_secret_is_refused(tmp_path: Path, mark: str) -> None:
    hub_req, peer_req, _ = start_gang(tmp_path, mark, {0: "sleep 100"}, {1: "sleep 100"},
                                      peer_secret="guess", lease=2, start_within=3)
    hub = wait_ended(hub_req, 20)
    peer = wait_ended(peer_req, 20)
    assert hub["root_cause"]["node"] == "n1" and "never reached" in hub["root_cause"]["detail"]
    assert peer["cause"] == "peer_lost"
    assert wait_gone(mark, 10) == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it exited since it was listed
        return b""


def _tree_of(req: dict[str, Any]) -> set[int]:
    """A detached supervisor and everything below it."""
    root = state_of(req)["supervisor_pid"]
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text()
                                          .rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found = {root}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found
