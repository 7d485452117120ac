"""End to end on this machine through the local transport: no root, no sshd. The README's
first command, and the exit statuses a user sees from a real run.

Every test runs the real `clusterrun` command with a private $CLUSTERRUN_HOME (the local
nodes' workdir follows it), so nothing is written to the user's own ~/.clusterrun.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterrun.errors import ExitStatus
from tests.conftest import REPO, run_cli, start_cli, write_inventory

LOCALHOST = "inventories/localhost.yaml"


@pytest.mark.slow  # two ranks that import torch and train: seconds of CPU each
def test_localhost_inventory_needs_no_sshd(home: Path, tmp_path: Path) -> None:
    """The README's first command: two local nodes, no SSH, no root. (The checkpoint goes to
    a private directory: a normal user may not write to the checkout.)"""
    cp = run_cli("launch", LOCALHOST, "payloads/train_digits.py", "--epochs", "2",
                 "--checkpoint-dir", str(tmp_path / "checkpoints"), timeout=300, cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"^\[node0 r0\] .*accuracy", cp.stdout, re.M), cp.stdout
    assert re.search(r"^\[node1 r1\] ", cp.stdout, re.M), cp.stdout
    assert os.path.isdir(home / "runs")


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job" / "job.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(body)
    return path


def test_a_failed_job_exits_with_the_root_cause_ranks_own_status(home: Path,
                                                                 tmp_path: Path) -> None:
    job = script(tmp_path, "import os, sys\nprint('rank', os.environ['RANK'], flush=True)\n"
                 "sys.exit(7 if os.environ['RANK'] == '1' else 0)\n")
    # Without torchrun, whose `import torch` on each node would be most of this test's time:
    # the outcome path is the controller's either way (tests/test_launch.py: under torchrun).
    cp = run_cli("launch", "--no-torchrun", "--grace", "2", LOCALHOST, str(job), timeout=120)
    assert cp.returncode == 7, cp.stderr
    assert "root cause: node1 rank 1 exited with code 7" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_a_stall_ended_by_on_stall_stop_is_7(home: Path, tmp_path: Path) -> None:
    """Ranks that print once and then sleep make no progress: with --on-stall stop the
    watchdog ends the run, names where they wait, and the run exits 7."""
    job = script(tmp_path, "import os, time\nprint('rank', os.environ['RANK'], 'up', flush=True)"
                 "\ntime.sleep(600)\n")
    cp = run_cli("launch", "--no-torchrun", "--grace", "2", "--stall-timeout", "3",
                 "--on-stall", "stop", LOCALHOST, str(job), timeout=120)
    assert cp.returncode == ExitStatus.STALLED == 7, cp.stderr
    assert "stall: no rank made progress for 3 s" in cp.stderr
    assert re.search(r"stall: ranks 0-1 \(node\[0-1\]\) wait in <module> \(job\.py:3\)",
                     cp.stderr), cp.stderr
    assert "Traceback" not in cp.stderr
    # Said once on the console, by the controller: the master's copy in its node.log (which
    # `logs` shows) is left out of the console's view of node.log.
    assert cp.stderr.count("stall: no rank made progress") == 1, cp.stderr
    assert "stall:" not in cp.stdout, cp.stdout
    # Recorded as a stall, not as a rank that exits 7: no rank stood out, so no host is blamed
    # (the master only ended the run), and the record says why.
    ps = run_cli("ps", "--json")
    [row] = json.loads(ps.stdout)
    blamed = {"node": None, "rank": None,
              "why": "no rank made progress for 3 s; 2 ranks, 1 different stack"}
    assert (row["state"], row["exit_status"], row["outcome"], row["stalled"]) == (
        "failed", 7, "stalled", blamed), row
    summary = json.loads((home / "runs" / row["id"] / "summary.json").read_text())
    assert (summary["outcome"], summary["stalled"]) == ("stalled", blamed)
    assert re.search(rf"^{row['id']} +stalled \(stopped\) ", run_cli("ps").stdout, re.M)


def wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float) -> str:
    """What ``proc`` printed up to the first line matching ``pattern``. It reads the pipe's
    descriptor itself: a buffered ``readline`` after ``select`` can take in two lines at once
    and hand out one, leaving the awaited line in its buffer while ``select`` waits on the
    descriptor for output that never comes (a job that prints once, then sleeps)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # the end: the command exited
            break
        seen += chunk
        if re.search(pattern, seen.decode(errors="replace"), re.M):
            return seen.decode(errors="replace")
    ended = proc.poll()
    if ended is None:  # still running after the timeout: end it, to read what it said
        proc.kill()
        proc.wait()
    # What the command said on stderr: the cause, when the line never came.
    said = proc.stderr.read() if proc.stderr is not None else ""
    raise AssertionError(f"{pattern!r} not seen; got:\n{seen.decode(errors='replace')}\n"
                         f"exit status {ended}, stderr:\n{said}")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, ExitStatus.SIGINT),
                                                (signal.SIGTERM, ExitStatus.SIGTERM)])
def test_ctrl_c_and_sigterm_stop_the_run_with_their_statuses(
        home: Path, tmp_path: Path, signum: signal.Signals, status: ExitStatus) -> None:
    job = script(tmp_path, "import os, time\nprint('ready', os.environ['RANK'], flush=True)\n"
                 "time.sleep(120)\n")
    proc = start_cli("launch", "--no-torchrun", "--grace", "2", LOCALHOST, str(job))
    try:
        wait_for_line(proc, r"^\[node\d r\d\] ready", 120)
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, err


@pytest.mark.slow  # the smoke ranks import torch
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, ExitStatus.SIGINT),
                                                (signal.SIGTERM, ExitStatus.SIGTERM)])
def test_ctrl_c_and_sigterm_stop_check_smoke_with_their_statuses(
        home: Path, signum: signal.Signals, status: ExitStatus) -> None:
    proc = start_cli("check", "--smoke", LOCALHOST, stderr=subprocess.STDOUT)
    try:
        # The smoke run's banner: its launch has begun and stops what it started (before it,
        # a signal only ends preflight: test_a_signal_during_preflight_...).
        wait_for_line(proc, r"^clusterrun: run \S+: 2 nodes", 120)
        proc.send_signal(signum)
        out, _err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, out
    assert "succeeded (exit 0)" not in out  # stopped, not finished before the signal


def test_exec_on_a_host_whose_setup_fails_is_3(home: Path, tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", [{"host": "localhost", "name": "n0",
                                                   "setup": "exit 1"}])
    cp = run_cli("exec", str(inv), "--", "touch", str(tmp_path / "ran"), timeout=60)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    assert "probe failed: n0: could not run the command (exit status 1)" in cp.stderr
    assert not (tmp_path / "ran").exists()


def test_exec_timeout_is_124_not_unreachable(home: Path) -> None:
    started = time.monotonic()
    cp = run_cli("exec", "--timeout", "1", LOCALHOST, "--", "sleep 30", timeout=60)
    assert cp.returncode == ExitStatus.TIMEOUT, cp.stderr
    assert time.monotonic() - started < 20
    assert "unreachable" not in cp.stderr.lower()


def test_check_of_the_localhost_inventory_passes(home: Path) -> None:
    cp = run_cli("check", LOCALHOST, timeout=60)
    assert cp.returncode == ExitStatus.SUCCESS, cp.stdout + cp.stderr


def test_a_failed_check_is_3_and_names_the_real_interfaces(home: Path, tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", [{"host": "localhost", "name": "n0"},
                                                  {"host": "localhost", "name": "n1"}],
                          defaults={"interface": "nosuch0"})
    cp = run_cli("check", str(inv), timeout=60)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    assert "'nosuch0' does not exist" in cp.stdout and "lo (127.0.0.1/8" in cp.stdout


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_ssh_connection_is_4(home: Path, tmp_path: Path) -> None:
    """127.0.0.2 is not `localhost` to clusterrun: it goes through the SSH client, and nothing
    listens on that port."""
    inv = write_inventory(tmp_path / "inv.yaml",
                          [{"host": "127.0.0.2", "port": closed_port(), "name": "gone"}])
    cp = run_cli("check", str(inv), timeout=60)
    assert cp.returncode == ExitStatus.UNREACHABLE, cp.stdout + cp.stderr
    assert "connection refused" in cp.stdout
    job = script(tmp_path, "print('never')\n")
    cp = run_cli("launch", str(inv), str(job), timeout=60)
    assert cp.returncode == ExitStatus.UNREACHABLE, cp.stdout + cp.stderr
    assert "connection refused" in cp.stdout + cp.stderr and "never" not in cp.stdout


def test_a_bad_inventory_is_2_before_anything_is_contacted(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: 10.0.0.1\n    port: 99999\n")
    cp = run_cli("check", str(inv), timeout=60)
    assert cp.returncode == ExitStatus.USAGE, cp.stderr
    assert f"{inv}:3" in cp.stderr and "Traceback" not in cp.stderr


def test_an_internal_error_is_1_with_a_traceback_to_report(tmp_path: Path) -> None:
    crash = ("import clusterrun.preflight.checks as checks\n"
             "def boom(*args, **kwargs):\n    raise RuntimeError('boom')\n"
             "checks.run = boom\n"
             "from clusterrun.cli import main\n"
             f"main(['check', {LOCALHOST!r}])\n")
    cp = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True,
                        cwd=REPO, timeout=60, check=False)
    assert cp.returncode == ExitStatus.ERROR, cp.stderr
    assert "RuntimeError: boom" in cp.stderr


@pytest.mark.parametrize("command", ["check", "launch"])
@pytest.mark.parametrize("sent", [(signal.SIGINT, ExitStatus.SIGINT, "interrupted"),
                                  (signal.SIGTERM, ExitStatus.SIGTERM, "terminated (SIGTERM)")])
def test_a_signal_during_preflight_ends_with_its_status_and_a_word(
        home: Path, tmp_path: Path, command: str,
        sent: tuple[signal.Signals, ExitStatus, str]) -> None:
    """Ctrl-C or SIGTERM while a host's SSH handshake hangs (before any run exists): the
    signal's status and one line, no traceback, at once and not after the connect timeout."""
    import threading

    signum, status, word = sent
    mute = socket.create_server(("0.0.0.0", 0))
    connected = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:  # TCP accepts, nothing ever says SSH-2.0
        try:
            while True:
                held.append(mute.accept()[0])
                connected.set()
        except OSError:
            return

    threading.Thread(target=serve, daemon=True).start()
    inv = write_inventory(tmp_path / "inv.yaml", [
        {"host": "127.0.0.2", "port": mute.getsockname()[1], "name": "n0"}])
    job = script(tmp_path, "raise SystemExit('must not run')\n")
    args = [command, "--connect-timeout", "60", str(inv)] + ([str(job)] if command == "launch"
                                                              else [])
    proc = start_cli(*args)
    try:
        assert connected.wait(30), "the controller never connected"
        began = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        mute.close()
        for sock in held:
            sock.close()
    assert proc.returncode == status, out + err
    assert err.strip().splitlines()[-1] == f"clusterrun: {word}", err
    assert "Traceback" not in out + err
    assert took < 10, f"{took:.1f} s: it waited for the connect timeout"
