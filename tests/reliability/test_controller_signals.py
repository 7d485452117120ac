"""Scenario 4: the controller is signalled mid-run (3 hosts x 2 ranks) → each signal ends the run
as docs/exit-status.md and docs/how-it-works.md say, with a clear message, no traceback and no
process left on any host:

- Ctrl-C (SIGINT to the terminal's process group): every rank gets SIGTERM, exit 130;
- Ctrl-C twice, ranks ignoring SIGTERM: the second one kills at once, not after --grace;
- SIGTERM: as Ctrl-C, exit 143;
- SIGKILL: the SSH channels close, each supervisor ends its node (lifeline EOF); `ps` says lost;
- SIGSTOP for longer than --lease: each supervisor ends its node when the lease runs out; after
  SIGCONT the controller says so at once and exits 5 (the nodes lost it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clusterrun.launch.session import HEARTBEAT
from tests.conftest import Cluster, Reader, copy_payload, run_cli, start_cli
from tests.reliability.conftest import Timed

HOSTS = ["node1", "node2", "node3"]
GRACE = 5.0
LEASE = 10.0


@dataclass
class Run:
    cluster: Cluster
    home: Path
    proc: subprocess.Popen[str]
    out: Reader
    err: Reader
    test_dir: str

    @property
    def run_id(self) -> str:
        return next((self.home / "runs").iterdir()).name

    def signal(self, signum: int) -> None:
        """As the terminal does for Ctrl-C: to the whole process group."""
        os.killpg(self.proc.pid, signum)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self.out.join()
        self.err.join()
        return code

    def terms(self) -> int:
        """How many ranks ran their SIGTERM handler."""
        return sum(self.cluster.run_on(n, "sh", "-c", f"ls {self.test_dir} 2>/dev/null || true")
                   .count(".term") for n in HOSTS)

    def host_state(self, host: str) -> dict[str, Any]:
        return dict(json.loads(self.cluster.read(
            host, f"/tmp/clusterrun/runs/{self.run_id}/{host}/state.json")))


@pytest.fixture
def start(cluster: Cluster, home: Path, tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Starts the run (every rank sleeping) and waits until all six ranks are up; ends whatever
    is left afterwards: the controller (also when stopped) and the hosts' processes."""
    started: list[Run] = []

    def launch(*options: str) -> Run:
        inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
        payload = copy_payload(tmp_path, "faulty.py")
        test_dir = f"/tmp/clusterrun-faulty/{uuid.uuid4().hex[:8]}"
        proc = start_cli("launch", "--nproc-per-node", "2", "--grace", str(GRACE),
                         "--lease", str(LEASE), "--env", f"TEST_DIR={test_dir}", *options,
                         str(inv), str(payload), start_new_session=True)
        run = Run(cluster, home, proc, Reader(proc.stdout),  # type: ignore[arg-type]
                  Reader(proc.stderr), test_dir)  # type: ignore[arg-type]
        started.append(run)
        try:
            run.out.wait_for(r"faulty rank \d on", count=6)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstderr:\n{run.err.text}") from None
        return run

    yield launch
    for run in started:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGCONT)
            run.proc.kill()
            run.proc.wait(10)
    cluster.kill_all(HOSTS)


def no_traceback(run: Run) -> None:
    assert "Traceback" not in run.err.text + run.out.text, run.err.text


def test_ctrl_c_stops_every_rank_gracefully(start: Callable[..., Run], timed: Timed) -> None:
    run = start()
    with timed("controller Ctrl-C: every host clean", GRACE + 10) as t:
        run.signal(signal.SIGINT)
        code = run.finish(GRACE + 10)
        left = run.cluster.wait_no_processes(HOSTS, GRACE + 10 - t.seconds)
        t.stop()
        assert left == {}, left
    assert code == 130, run.err.text
    assert "clusterrun: SIGINT: stopping the run on every node" in run.err.text
    assert "interrupted (SIGINT): the run was stopped on every node" in run.err.text
    assert f"run {run.run_id} stopped (exit 130)" in run.err.text
    assert run.terms() == 6  # each rank was asked (SIGTERM), not killed
    no_traceback(run)


def test_second_ctrl_c_kills_ranks_that_ignore_sigterm(start: Callable[..., Run],
                                                       timed: Timed) -> None:
    run = start("--grace", "60", "--env", "IGNORE_TERM=1")
    run.signal(signal.SIGINT)
    run.err.wait_for("press Ctrl-C again")
    time.sleep(1)
    # Still in its 60 s grace period: the ranks ignore SIGTERM.
    assert run.cluster.wait_no_processes(HOSTS, 0) != {}
    with timed("controller double Ctrl-C, ranks ignoring SIGTERM: every host clean", 10) as t:
        run.signal(signal.SIGINT)
        code = run.finish(10)
        left = run.cluster.wait_no_processes(HOSTS, 10 - t.seconds)
        t.stop()
        assert left == {}, left
    assert code == 130, run.err.text
    assert "SIGINT again: killing the run on every node now" in run.err.text
    assert run.terms() == 0
    no_traceback(run)


def test_sigterm_stops_the_run_with_143(start: Callable[..., Run], timed: Timed) -> None:
    run = start()
    with timed("controller SIGTERM: every host clean", GRACE + 10) as t:
        run.proc.send_signal(signal.SIGTERM)  # as `kill PID` or a scheduler does
        code = run.finish(GRACE + 10)
        left = run.cluster.wait_no_processes(HOSTS, GRACE + 10 - t.seconds)
        t.stop()
        assert left == {}, left
    assert code == 143, run.err.text
    assert "interrupted (SIGTERM): the run was stopped on every node" in run.err.text
    assert run.terms() == 6
    no_traceback(run)
    assert json.loads((run.home / "runs" / run.run_id / "state.json").read_text())[
        "state"] == "stopped"


def test_sigkilled_controller_leaves_nothing_and_ps_says_lost(start: Callable[..., Run],
                                                             timed: Timed) -> None:
    run = start()
    with timed("controller SIGKILL: every host clean (lifeline EOF)", GRACE + 10) as t:
        run.proc.kill()
        run.finish(5)
        left = run.cluster.wait_no_processes(HOSTS, GRACE + 10 - t.seconds)
        t.stop()
        assert left == {}, left
    for host in HOSTS:
        state = run.host_state(host)
        assert state["state"] == "lost" and "lifeline lost" in state["reason"], state
    assert run.terms() == 6
    ps = run_cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    row = next(r for r in json.loads(ps.stdout) if r["id"] == run.run_id)
    assert (row["state"], row["exit_status"]) == ("lost", 5), row


def test_sigstop_past_the_lease_then_sigcont(start: Callable[..., Run], timed: Timed) -> None:
    """The nodes cannot tell a stopped controller from a dead one: each ends its part when the
    lease runs out. Once it runs again, the controller says what happened at once and exits 5,
    instead of blaming a node or waiting for anything."""
    run = start()
    run.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        with timed("controller SIGSTOP: nodes end the run after the lease (10 s)",
                   LEASE + GRACE + 5) as t:
            left = run.cluster.wait_run_gone(HOSTS, run.run_id, LEASE + GRACE + 5)
            t.stop()
            assert left == {}, left
        # The lease runs from the last heartbeat a node heard, which left up to one heartbeat
        # period (plus the heartbeat thread's own delay) before the stop: not before that.
        assert time.monotonic() - stopped > LEASE - HEARTBEAT - 1
        assert run.proc.poll() is None
    finally:
        run.proc.send_signal(signal.SIGCONT)
    with timed("controller SIGCONT after a stop past the lease: exits", 5) as t:
        code = run.finish(10)
        t.stop()
    assert code == 5, run.err.text
    assert ("this controller was stopped or suspended for" in run.err.text
            and "so each one ends the run on its own" in run.err.text), run.err.text
    causes = [line for line in run.err.text.splitlines() if "root cause:" in line]
    expected = "ended the run itself: lifeline lost: no heartbeat from the controller"
    assert len(causes) == 1 and expected in causes[0], run.err.text
    assert "was lost: no word from it" not in run.err.text  # no node is blamed
    assert f"run {run.run_id} lost (exit 5)" in run.err.text
    no_traceback(run)
    assert run.cluster.wait_no_processes(HOSTS, 5) == {}
    for host in HOSTS:
        assert run.host_state(host)["cause"] == "lease_expired"
