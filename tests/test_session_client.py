"""The thin client: a command that reaches its hosts through a running daemon imports neither
paramiko, fabric, invoke nor cryptography before its first request, the daemon reads the
known_hosts files for it, and a bad one is still said by the command, exit 2, word for word as
without the session."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun import transport
from clusterrun.remote.shared import frames
from clusterrun.session import client, daemon, paths
from clusterrun.transport import hostkeys
from tests.conftest import REPO, run_cli

HEAVY = ("cryptography", "fabric", "invoke", "paramiko")

# The command line, noting which of HEAVY are loaded at each write on a Unix socket (the
# daemon's) and at exit: {"sends": [[...], ...], "exit": [...]} on stderr's last line.
WATCHED = f"""
import atexit, json, socket, sys
def loaded():
    return sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
sends = []
_sendall = socket.socket.sendall
def sendall(self, data, *args):
    if self.family == socket.AF_UNIX:
        sends.append(loaded())
    return _sendall(self, data, *args)
socket.socket.sendall = sendall
atexit.register(lambda: sys.stderr.write(
    "\\nLOADED " + json.dumps({{"sends": sends, "exit": loaded()}}) + "\\n"))
from clusterrun.cli import main
main(sys.argv[1:])
"""


@pytest.fixture
def session_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short: a Unix socket's path has a length limit, and pytest's tmp_path is deep.
    with tempfile.TemporaryDirectory(prefix="crs-") as folder:
        monkeypatch.setenv("CLUSTERRUN_HOME", folder)
        monkeypatch.setenv("CLUSTERRUN_SESSION", "1")
        yield Path(folder)


@pytest.fixture
def served(session_home: Path) -> Iterator[daemon.Daemon]:
    """A daemon of this code, served from this process (which may load paramiko: the command
    under test is another process)."""
    made = daemon.Daemon(daemon.listen(str(paths.socket_path())), transport.direct, 600)
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    yield made
    made.stop("test over")
    thread.join(5)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def inventory(tmp_path: Path, known: Path) -> Path:
    """One SSH host at a closed loopback port (127.0.0.2 is not `localhost` to clusterrun):
    the daemon's connection is refused at once, and nothing leaves this machine."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"defaults:\n  known_hosts: {known}\nhosts:\n  - host: 127.0.0.2\n"
                   f"    port: {closed_port()}\n")
    return inv


def known_hosts(tmp_path: Path, good: bool) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "known_hosts"
    key = "AAAAC3NzaC1lZDI1NTE5AAAAIJIFQvGOPArW9lGI3cyGA1OO1imdKwewJ9ZpdfijiDGg" if good \
        else "AAAA!!!notbase64"
    path.write_text(f"# fine\n10.0.0.1 ssh-ed25519 {key}\n")
    return path


def watched(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cp = subprocess.run([sys.executable, "-c", WATCHED, *args], capture_output=True, text=True,
                        cwd=REPO, timeout=60, check=False)
    line = next((x for x in cp.stderr.splitlines() if x.startswith("LOADED ")), None)
    assert line is not None, cp.stderr
    return cp, json.loads(line.removeprefix("LOADED "))


@pytest.mark.parametrize("command", ["exec", "check", "launch"])
def test_a_warm_command_sends_its_first_request_without_paramiko(
        served: daemon.Daemon, tmp_path: Path, command: str) -> None:
    inv = inventory(tmp_path, known_hosts(tmp_path, good=True))
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    tail = {"exec": ["--", "true"], "check": [], "launch": [str(script)]}[command]
    cp, loaded = watched(command, "--connect-timeout", "5", str(inv), *tail)
    assert cp.returncode == 4, cp.stderr  # the daemon's connection was refused, as direct
    assert "refused" in cp.stdout + cp.stderr, cp.stdout + cp.stderr
    # Two requests at least: the known_hosts files, then the host.
    assert len(loaded["sends"]) >= 2 and loaded["sends"][:2] == [[], []], loaded


def test_a_bad_known_hosts_is_said_as_without_the_session(served: daemon.Daemon,
                                                           tmp_path: Path) -> None:
    known = known_hosts(tmp_path, good=False)
    inv = inventory(tmp_path, known)
    said = {}
    for session in ("1", "0"):
        cp = run_cli("exec", "--connect-timeout", "5", str(inv), "--", "true",
                     env={"CLUSTERRUN_SESSION": session})
        assert cp.returncode == 2, cp.stderr
        said[session] = cp.stderr
    assert said["1"] == said["0"]
    assert said["1"].startswith(f"clusterrun: error: {known}:2: cannot read this known_hosts")
    assert served.status()["hosts"] == []  # no host was contacted


def test_the_daemon_reads_the_known_hosts_files(served: daemon.Daemon, tmp_path: Path) -> None:
    good, bad = known_hosts(tmp_path / "a", good=True), known_hosts(tmp_path / "b", good=False)
    assert client.known_hosts_readable([str(good), str(tmp_path / "missing")])
    assert not client.known_hosts_readable([str(good), str(bad)])


def test_without_a_daemon_the_command_reads_them_itself(session_home: Path) -> None:
    assert client.ask(frames.STATUS) is None
    assert not client.known_hosts_readable(["/nonexistent/known_hosts"])
    assert client.ask(frames.STATUS) is None  # and asking started none


def test_local_hosts_read_no_known_hosts_through_the_session(session_home: Path,
                                                             tmp_path: Path) -> None:
    """A local host never reads known_hosts: through the session its file is not looked at,
    and no paramiko is loaded for it."""
    known = known_hosts(tmp_path, good=False)
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"defaults:\n  known_hosts: {known}\nhosts:\n  - host: localhost\n")
    cp, loaded = watched("exec", str(inv), "--", "true")
    assert cp.returncode == 0, cp.stderr
    assert loaded == {"sends": [], "exit": []}, loaded


def test_the_daemon_reads_a_file_again_only_once_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = known_hosts(tmp_path, good=True)
    assert hostkeys.readable([str(good)])
    read: list[object] = []
    monkeypatch.setattr(hostkeys, "check_files", read.append)
    assert hostkeys.readable([str(good)]) and read == []  # remembered: not read again
    good.write_text(good.read_text() + "# a line more\n")
    assert hostkeys.readable([str(good)]) and len(read) == 1
    monkeypatch.undo()
    bad = known_hosts(tmp_path / "bad", good=False)
    assert not hostkeys.readable([str(bad)])
    assert not hostkeys.readable([str(bad)])  # a bad file is never remembered as good
