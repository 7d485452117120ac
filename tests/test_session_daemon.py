"""The warm session's daemon and thin client on this machine: a localhost host (reached
without sshd) through the daemon, the lifeline when a client or the daemon dies, the uid check,
idle exit, and the connection key."""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun import transport
from clusterrun.remote.shared import frames
from clusterrun.session import client, daemon, hostlink, paths
from clusterrun.transport.base import ConnectError, SshOptions
from tests.conftest import REPO, host_spec, run_cli

LOCAL = host_spec("localhost", "here")


@pytest.fixture
def session_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short: a Unix socket's path has a length limit, and pytest's tmp_path is deep.
    with tempfile.TemporaryDirectory(prefix="crs-") as folder:
        monkeypatch.setenv("CLUSTERRUN_HOME", folder)
        yield Path(folder)
        client.ask(frames.STOP)


class Served:
    def __init__(self, idle: float = 600, uid: int | None = None,
                 path: Path | None = None) -> None:
        listener = daemon.listen(str(path or paths.socket_path()))
        self.daemon = daemon.Daemon(listener, transport.direct, idle, uid=uid)
        self.thread = threading.Thread(target=self.daemon.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.daemon.stop("test over")
        self.thread.join(5)


@pytest.fixture
def served(session_home: Path) -> Iterator[Served]:
    made = Served()
    yield made
    made.stop()


def wait_for(path: Path, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def connected() -> client.SessionTransport:
    made = client.SessionTransport(LOCAL, SshOptions())
    made.connect()
    return made


def test_commands_run_through_the_daemon_on_one_agent(served: Served) -> None:
    first = connected()
    proc = first.run("cat; echo err >&2; exit 4")
    proc.write(b"hello\n")
    proc.close_stdin()
    assert proc.recv(100) == b"hello\n" and proc.recv_stderr(100) == b"err\n"
    assert proc.wait(10) == 4 and proc.recv(100) == b""
    second = connected()  # another command: the same connection and agent
    assert second.agent_pid == first.agent_pid
    assert second.run("exit 0").wait(10) == 0
    status = client.ask(frames.STATUS)
    assert status is not None and [h["agent_pid"] for h in status["hosts"]] == [first.agent_pid]
    first.close()
    second.close()


def test_pings_keep_the_agent(session_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "PING_EVERY", 0.1)
    served = Served()
    try:
        made = connected()
        time.sleep(0.6)
        assert made.run("exit 0").wait(10) == 0
        status = client.ask(frames.STATUS)
        assert status is not None
        assert [(h["agent_pid"], h["alive"]) for h in status["hosts"]] == [(made.agent_pid, True)]
        made.close()
    finally:
        served.stop()


def test_a_closed_client_ends_its_commands_stdin(served: Served, tmp_path: Path) -> None:
    mark = tmp_path / "saw-eof"
    made = connected()
    made.run(f"cat >/dev/null; touch {mark}")
    assert not wait_for(mark, 0.3)
    made.close()
    assert wait_for(mark), "the command's stdin did not close with its client"


CLIENT = """
import sys, time
from clusterrun.session import client
from clusterrun.transport.base import SshOptions
from tests.conftest import host_spec
t = client.SessionTransport(host_spec("localhost", "here"), SshOptions())
t.connect()
t.run("cat >/dev/null; touch " + sys.argv[1])
print("started", flush=True)
time.sleep(60)
"""


def test_a_killed_client_ends_its_commands_stdin(served: Served, tmp_path: Path) -> None:
    mark = tmp_path / "saw-eof"
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(mark)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    assert not wait_for(mark, 0.3)
    proc.kill()
    proc.wait()
    assert wait_for(mark), "a SIGKILLed client left its command's stdin open"


def test_a_killed_daemon_ends_its_commands_stdin(session_home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon started on demand, as a command starts it; SIGKILLed, its agents' channels
    close, they exit, and each command they carried sees EOF."""
    monkeypatch.setenv("CLUSTERRUN_SESSION_COLD", "wait")  # started to be gone through
    made = connected()
    mark = tmp_path / "saw-eof"
    made.run(f"cat >/dev/null; touch {mark}")
    status = client.ask(frames.STATUS)
    assert status is not None
    os.kill(status["pid"], signal.SIGKILL)
    assert wait_for(mark), "the command outlived its daemon's lifeline"
    with pytest.raises(ConnectError):
        made.run("true")  # its daemon is gone: a lost connection, as for SSH
    made.close()


def test_another_uid_is_refused(session_home: Path) -> None:
    served = Served(uid=os.getuid() + 1)  # the daemon of someone else
    try:
        with pytest.raises(ConnectError, match="belongs to another user"):
            connected()
    finally:
        served.stop()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to be another user")
def test_another_user_gets_nothing_even_past_the_folder(session_home: Path) -> None:
    """The folder's 0700 is the first lock; the uid check holds where it would be open."""
    with tempfile.TemporaryDirectory(prefix="crs-open-") as folder:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "sock")
        listener = daemon.listen(path)
        os.chmod(path, 0o666)
        served = daemon.Daemon(listener, transport.direct, 600)
        thread = threading.Thread(target=served.serve, daemon=True)
        thread.start()
        probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                 "s.sendall(bytes.fromhex(sys.argv[2]))\n"
                 "print(repr(s.recv(4096)))\nprint(repr(s.recv(4096)))\n")
        ask = frames.encode_json(frames.RUN, 1, {frames.CONTROL: frames.STATUS}).hex()
        out = subprocess.run(["/usr/bin/python3", "-S", "-c", probe, path, ask],
                             capture_output=True, text=True, timeout=30, check=False,
                             user=65534, group=65534)
        served.stop("test over")
        thread.join(5)
    assert out.returncode == 0, out.stderr
    refusal, end = out.stdout.splitlines()
    said = ast.literal_eval(refusal)
    assert b"another user" in said and b'"pid"' not in said
    assert ast.literal_eval(end) == b""


def test_the_daemon_exits_when_idle(session_home: Path) -> None:
    served = Served(idle=1.0)
    made = connected()
    time.sleep(2.5)
    assert served.thread.is_alive(), "exited with a client connected"
    made.close()
    served.thread.join(5)
    assert not served.thread.is_alive(), "still running after its idle time"


def test_status_requests_do_not_keep_the_daemon(session_home: Path) -> None:
    """`clusterrun session --json` polled in a loop (a dashboard, a watch) is not use: only
    a command that names a host keeps the daemon and its connections."""
    served = Served(idle=1.0)
    seen = []
    deadline = time.monotonic() + 8
    while served.thread.is_alive() and time.monotonic() < deadline:
        status = client.ask(frames.STATUS)
        if status:  # None or {}: it stopped meanwhile
            seen.append(status["idle"])
        time.sleep(0.2)
    assert not served.thread.is_alive(), f"status requests kept it running (idle: {seen})"
    assert seen and max(seen) >= 0.8, seen  # its idle time grew under the polling


def test_idle_time_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_SESSION_IDLE", "42")
    assert paths.idle_seconds() == 42
    monkeypatch.setenv("CLUSTERRUN_SESSION_IDLE", "soon")
    assert paths.idle_seconds() == paths.IDLE
    monkeypatch.setenv("CLUSTERRUN_SESSION", "1")
    assert paths.enabled()
    monkeypatch.setenv("CLUSTERRUN_SESSION", "0")
    assert not paths.enabled()


def test_the_connection_key_names_everything_that_makes_the_connection() -> None:
    base = client.spec_fields(host_spec("10.0.0.1", "a"))
    key = hostlink.connection_key(base, {})
    assert hostlink.connection_key({**base, "name": "other-name", "line": 9}, {}) == key
    for change in ({"identity_file": "/k2"}, {"known_hosts": "/kh2"}, {"port": 2222},
                   {"user": "bob"}, {"proxy_jump": "bastion"}, {"host": "10.0.0.2"}):
        assert hostlink.connection_key({**base, **change}, {}) != key, change
    assert hostlink.connection_key(base, {"accept_new_host_keys": True}) != key


def test_the_session_folder_is_private(session_home: Path) -> None:
    folder = paths.folder()
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)
    with pytest.raises(Exception, match="mode 0700"):
        paths.folder()
    folder.chmod(0o700)


def test_the_socket_is_not_open_to_others(served: Served) -> None:
    assert os.stat(paths.socket_path()).st_mode & 0o077 == 0
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(paths.socket_path()))
    assert daemon.peer_uid(sock) == os.getuid()
    sock.close()


def test_the_session_command_shows_and_stops_the_daemon(served: Served) -> None:
    made = connected()
    cp = run_cli("session", "--json")
    assert cp.returncode == 0, cp.stderr
    status = json.loads(cp.stdout)
    assert status["running"] and status["pid"] == os.getpid()  # served from this process
    assert [(h["name"], h["agent_pid"]) for h in status["hosts"]] == [("here", made.agent_pid)]
    cp = run_cli("session")
    assert f"agent pid {made.agent_pid}" in cp.stdout, cp.stdout + cp.stderr
    made.close()
    cp = run_cli("session", "stop")
    assert cp.returncode == 0 and "session stopped" in cp.stdout, cp.stdout + cp.stderr
    served.thread.join(5)
    assert not served.thread.is_alive()
    cp = run_cli("session", "--json")
    assert json.loads(cp.stdout) == {"running": False, "other_daemons": []}
    assert "no session running" in run_cli("session", "stop").stdout


def test_a_daemon_of_other_code_is_never_used_and_session_stop_ends_it(
        session_home: Path) -> None:
    """An upgrade (or an edit in a checkout) leaves the old daemon running: the socket is
    named for the code, so commands start their own, and `session stop` ends both."""
    assert paths.socket_path().name == f"sock-{paths.stamp()}"
    old = Served(path=paths.socket_path().with_name("sock-0123456789"))
    cp = run_cli("session", "--json")
    assert json.loads(cp.stdout) == {"running": False, "other_daemons": [os.getpid()]}
    assert "a daemon of other clusterrun code" in run_cli("session").stdout
    assert client.ask(frames.STATUS) is None  # this code's socket: nobody there
    cp = run_cli("session", "stop")
    assert cp.returncode == 0 and f"daemon pid {os.getpid()}" in cp.stdout, cp.stdout + cp.stderr
    old.thread.join(5)
    assert not old.thread.is_alive()
    assert json.loads(run_cli("session", "--json").stdout)["other_daemons"] == []


def test_a_shell_with_another_ssh_agent_or_home_gets_a_daemon_of_its_own(
        session_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon makes new connections long after the command that started it, with that
    command's ssh-agent and ~/.ssh/config: a command from a new login (another SSH_AUTH_SOCK)
    or with another HOME must not authenticate through it."""
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-first/agent.1")
    first = Served()
    try:
        mine = run_cli("session", "--json")
        assert json.loads(mine.stdout)["pid"] == os.getpid(), mine.stdout + mine.stderr
        for change in ({"SSH_AUTH_SOCK": "/tmp/ssh-second/agent.2"}, {"HOME": str(session_home)}):
            cp = run_cli("session", "--json", env=change)
            assert json.loads(cp.stdout) == {"running": False, "other_daemons": [os.getpid()]}
        monkeypatch.delenv("SSH_AUTH_SOCK")
        assert client.ask(frames.STATUS) is None  # no agent at all is another environment too
        monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-first/agent.1")
        assert client.ask(frames.STATUS) is not None
    finally:
        first.stop()
