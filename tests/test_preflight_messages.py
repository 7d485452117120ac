"""Preflight messages for problems a user causes: each names the host, the cause and the fix."""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

import pytest

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.preflight import decide
from clusterrun.preflight.answers import Listening
from clusterrun.preflight.checks import _port_problem
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.probe_session import ProbeSession
from clusterrun.preflight.report import HostReport
from clusterrun.transport import shell
from clusterrun.transport.programs import ProgramError
from tests.conftest import run_cli

PROBE = (Path(__file__).resolve().parent.parent / "clusterrun" / "remote" / "probe"
         / "probe.py")


def report(user: str = "alice") -> HostReport:
    rep = HostReport(HostSpec(host="10.0.0.1", name="gpu-a", master=True, line=3), 0)
    rep.facts = {"user": user}
    return rep


def test_a_low_port_as_a_normal_user_says_it_needs_root() -> None:
    text = _port_problem(report(), Listening.from_json({"ok": False, "port": 80,
                                                        "errno": errno.EACCES,
                                                        "error": "Permission denied"}))
    assert "ports below 1024 need root" in text and "alice" in text and "gpu-a" in text
    assert "another job" not in text.lower()


def test_a_port_in_use_says_another_job_may_hold_it() -> None:
    text = _port_problem(report(), Listening.from_json({"ok": False, "port": 29500,
                                                        "errno": errno.EADDRINUSE,
                                                        "error": "Address already in use"}))
    assert "29500 on gpu-a" in text and "Another job may hold it" in text


def _check_workdir(path: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "probe_under_test"}
    source = PROBE.read_text().replace("\nserve()\n", "\n")  # the functions, not the server
    exec(compile(source, str(PROBE), "exec"), namespace)
    return namespace["check_workdir"](path)  # type: ignore[operator]


def test_the_probe_creates_and_writes_the_workdir(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterrun.remote.shared import diskfloor

    # Free space moves while other processes write: the test sees the one reading the probe
    # took, where it took it, and never measures again to compare.
    read: list[tuple[str, object]] = []
    real = diskfloor.free_bytes

    def free_bytes(path: str) -> object:
        read.append((path, real(path)))  # type: ignore[no-untyped-call]
        return read[-1][1]

    monkeypatch.setattr(diskfloor, "free_bytes", free_bytes)
    target = tmp_path / "a" / "b"
    found = _check_workdir(str(target))
    assert found == {"path": str(target), "ok": True, "error": None, "free": found["free"],
                     "free_at": str(target)}
    assert read == [(str(target), found["free"])]
    assert 0 < found["free"] <= shutil.disk_usage(target).total  # type: ignore[operator]
    assert target.is_dir() and os.listdir(target) == []  # its test file is gone again
    assert oct(target.stat().st_mode & 0o777) == oct(0o700)


def test_a_workdir_without_room_for_a_run_fails_and_a_small_one_warns() -> None:
    spec = HostSpec("gpu1", "gpu1", master=True, line=1)
    facts = {"python_path": "/usr/bin/python3", "python": "3.11.7", "dns": {},
             "torch": {"version": "2.13.0"},
             "workdir": {"path": "/w", "ok": True, "error": None, "free": 5 * 2 ** 20}}
    found = {c.name: c for c in decide.host_checks(spec, HostFacts.from_json(facts))}["workdir"]
    assert not found.ok
    assert found.detail.startswith("/w on gpu1 has only 5.0 MiB free: a run stops below")
    facts["workdir"]["free"] = 300 * 2 ** 20
    found = {c.name: c for c in decide.host_checks(spec, HostFacts.from_json(facts))}["workdir"]
    assert found.ok and found.warning and "300.0 MiB" in found.detail
    facts["workdir"]["free"] = 50 * 2 ** 30
    found = {c.name: c for c in decide.host_checks(spec, HostFacts.from_json(facts))}["workdir"]
    assert found.ok and not found.warning and "50.0 GiB free" in found.detail


def test_a_workdir_that_cannot_be_created_fails_at_check_time() -> None:
    found = _check_workdir("/proc/forbidden")
    assert found["ok"] is False and found["error"]


def closed_port() -> int:
    """A loopback port nothing listens on (the kernel picked it, and it was let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_malformed_known_hosts_is_exit_2_before_any_host_is_contacted(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("# fine\n10.0.0.1 ssh-ed25519 AAAA!!!notbase64\n")
    inv = tmp_path / "inv.yaml"
    # A closed loopback port, reached through SSH (127.0.0.2 is not `localhost` to clusterrun):
    # a regression that connects first gets exit 4, never exit 2, and stays on this machine.
    inv.write_text(f"defaults:\n  known_hosts: {known}\nhosts:\n  - host: 127.0.0.2\n"
                   f"    port: {closed_port()}\n")
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    for argv in (["check"], ["exec"], ["launch"]):
        tail = ["--", "true"] if argv == ["exec"] else [str(script)] if argv == ["launch"] else []
        cp = run_cli(*argv, "--connect-timeout", "30", str(inv), *tail,
                     env={"CLUSTERRUN_HOME": str(tmp_path / "home")}, timeout=20)
        assert cp.returncode == 2, (argv, cp.stdout, cp.stderr)
        assert cp.stderr.startswith(f"clusterrun: error: {known}:2: cannot read this known_hosts")
        assert "Traceback" not in cp.stderr


class _Exited:
    """A host's interpreter that is already gone when the probe is written to it: the inventory's
    `setup:` failed at once (status 97 from clusterrun's wrapper)."""

    def write(self, data: bytes) -> None:
        raise OSError("Socket is closed")

    def close_stdin(self) -> None:
        raise OSError("Socket is closed")

    def recv(self, size: int) -> bytes:
        return b""

    def recv_stderr(self, size: int) -> bytes:
        text, self._err = getattr(self, "_err", b"conda: command not found\n"), b""
        return text

    def wait(self, timeout: object = None) -> int:
        return shell.SETUP_FAILED

    def close(self) -> None:
        return None


class _Host:
    spec = HostSpec(host="10.0.0.3", name="node3", master=False, line=5, setup="conda activate x")

    def run(self, command: str) -> _Exited:
        return _Exited()

    def close(self) -> None:
        return None


def test_a_setup_that_fails_at_once_is_reported_as_such_not_as_a_closed_socket() -> None:
    with pytest.raises(ProgramError) as caught:
        ProbeSession(_Host(), _Host.spec, timeout=5)  # type: ignore[arg-type]
    assert caught.value.outcome is Outcome.PROBE_FAILED
    assert "the inventory's `setup:` snippet failed there" in caught.value.message
    assert "conda: command not found" in caught.value.message
    assert "Socket is closed" not in caught.value.message
