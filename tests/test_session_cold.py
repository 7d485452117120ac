"""The cold path: a command that finds no daemon reaches its hosts directly, as with
--no-session, and hands the hosts it reached to a daemon started behind it, which connects
them so the next command finds them warm (clusterrun/session/starter.py). On this machine the
hosts are local ones (the daemon reaches them without sshd); on the namespace cluster, real SSH
hosts, counting logins."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun import sandbox, transport
from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import frames
from clusterrun.session import client, daemon, paths, starter
from clusterrun.transport.base import ConnectError, SshOptions, Transport
from clusterrun.transport.local import LocalTransport
from tests.conftest import Cluster, host_spec, run_cli
from tests.support import sessions

LOCAL = host_spec("localhost", "here")
REMOTE = [host_spec("10.0.0.1", "gpu-a", port=2222), host_spec("10.0.0.2", "gpu-b")]


@pytest.fixture
def session_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short: a Unix socket's path has a length limit, and pytest's tmp_path is deep.
    with tempfile.TemporaryDirectory(prefix="crs-") as folder:
        monkeypatch.setenv("CLUSTERRUN_HOME", folder)
        monkeypatch.setenv("CLUSTERRUN_SESSION", "1")
        monkeypatch.delenv("CLUSTERRUN_SESSION_COLD", raising=False)
        yield Path(folder)
        client.ask(frames.STOP)
        sessions.stop_ours()


@pytest.fixture
def cold(monkeypatch: pytest.MonkeyPatch) -> starter.Cold:
    """This test's command state, its hand-over held to what the test does: no timer fires,
    nothing runs at the test process's exit."""
    made = starter.Cold()
    monkeypatch.setattr(starter, "COLD", made)
    monkeypatch.setattr(starter, "HAND_OVER_AFTER", 3600.0)
    monkeypatch.setattr(starter.atexit, "register", lambda fn: fn)
    return made


class Reached:
    """``transport.direct`` as the tests see it: records each host, reaches none."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.refuse = refuse
        self.names: list[str] = []

    def __call__(self, spec: HostSpec, options: SshOptions) -> Transport:
        if spec.name in self.refuse:
            raise ConnectError(Outcome.UNREACHABLE, f"{spec.name}: refused")
        self.names.append(spec.name)
        return LocalTransport(spec)


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> Reached:
    made = Reached(refuse=("gpu-b",))
    monkeypatch.setattr(transport, "direct", made)
    return made


def wait_until(check: Callable[[], Any], timeout: float = 30) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout:g} s")


def held() -> list[str]:
    status = client.ask(frames.STATUS) or {}
    return [h["name"] for h in status.get("hosts", []) if h["alive"]]


def test_with_no_daemon_a_command_goes_direct_and_starts_none_while_it_runs(
        session_home: Path, cold: starter.Cold, direct: Reached) -> None:
    reached = client.connector(REMOTE[0], SshOptions(connect_timeout=3))
    assert isinstance(reached, LocalTransport) and direct.names == ["gpu-a"]
    assert cold.direct
    assert not paths.socket_path().exists() and sessions.ours() == []
    # Handed over later: what its first word with the daemon would have said, no more.
    assert cold._pending == [client.hello(REMOTE[0], SshOptions(connect_timeout=3))]
    assert cold._pending[0]["options"] == {"connect_timeout": 3, "accept_new_host_keys": False}


def test_a_host_the_command_could_not_reach_is_not_handed_over(
        session_home: Path, cold: starter.Cold, direct: Reached) -> None:
    with pytest.raises(ConnectError, match="refused"):
        client.connector(REMOTE[1], SshOptions())
    assert cold._pending == []


def test_once_direct_every_host_of_the_command_stays_direct(
        session_home: Path, cold: starter.Cold, direct: Reached) -> None:
    """A daemon that comes up halfway through a command (another command's) does not take the
    command's later hosts: each of its hosts is on the direct path for its whole life."""
    client.connector(REMOTE[0], SshOptions())
    started = daemon.Daemon(daemon.listen(str(paths.socket_path())), transport.direct, 600)
    threading.Thread(target=started.serve, daemon=True).start()
    try:
        third = host_spec("10.0.0.3", "gpu-c")
        assert isinstance(client.connector(third, SshOptions()), LocalTransport)
        assert direct.names == ["gpu-a", "gpu-c"]
    finally:
        started.stop("test over")


def test_the_hosts_handed_over_are_held_by_the_daemon_started_behind_the_command(
        session_home: Path, cold: starter.Cold) -> None:
    """The real start: the command binds the socket, the daemon it spawns (never waited for)
    accepts the hand-over queued there and connects the host; the next command finds it."""
    cold.reached(client.hello(LOCAL, SshOptions()))
    began = time.monotonic()
    cold.hand_over()
    assert time.monotonic() - began < 0.5  # a spawn, not a start: nothing waited for
    assert cold._pending == []
    assert wait_until(held) == ["here"]
    made = client.SessionTransport(LOCAL, SshOptions())
    made.connect()
    status = client.ask(frames.STATUS) or {}
    assert [h["agent_pid"] for h in status["hosts"]] == [made.agent_pid]  # the prewarmed one
    assert made.run("exit 3").wait(10) == 3
    made.close()
    assert len(sessions.ours()) == 1


def test_two_commands_handing_over_at_once_start_one_daemon(session_home: Path) -> None:
    other = host_spec("localhost", "there", python=sys.executable)  # another connection key
    done = []

    def hand(spec: HostSpec) -> None:
        starter.hand_over([client.hello(spec, SshOptions())])
        done.append(spec.name)

    threads = [threading.Thread(target=hand, args=(spec,)) for spec in (LOCAL, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(done) == ["here", "there"]
    assert wait_until(lambda: sorted(held()) == ["here", "there"])
    assert len(sessions.ours()) == 1


def test_a_daemon_that_cannot_start_never_fails_the_command(
        session_home: Path, cold: starter.Cold, direct: Reached,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_listener: object) -> None:
        raise OSError("no interpreter")

    monkeypatch.setattr(starter, "spawn", broken)
    client.connector(REMOTE[0], SshOptions())
    cold.hand_over()  # swallowed: the command's work is done
    assert not paths.socket_path().exists()  # the next command finds none, and goes direct
    assert client.ask(frames.STATUS) is None


def test_a_daemon_that_dies_before_it_answers_sends_the_host_direct(
        session_home: Path, cold: starter.Cold, direct: Reached,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With CLUSTERRUN_SESSION_COLD=wait the command goes through the daemon it starts; one
    that never serves (it died starting) closes the queued connection, and the host is reached
    directly instead of failing the command."""
    monkeypatch.setenv("CLUSTERRUN_SESSION_COLD", "wait")
    monkeypatch.setattr(starter, "spawn", lambda _listener: None)
    assert isinstance(client.connector(REMOTE[0], SshOptions()), LocalTransport)
    assert direct.names == ["gpu-a"] and cold.direct


def test_a_socket_that_cannot_be_bound_sends_the_host_direct(
        session_home: Path, cold: starter.Cold, direct: Reached,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_SESSION_COLD", "wait")

    def full(_path: str) -> object:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(starter, "listen", full)
    assert isinstance(client.connector(REMOTE[0], SshOptions()), LocalTransport)
    assert direct.names == ["gpu-a"] and cold.direct


def test_with_cold_wait_the_first_command_goes_through_the_daemon(
        session_home: Path, cold: starter.Cold, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_SESSION_COLD", "wait")
    made = client.SessionTransport(LOCAL, SshOptions())
    made.connect()
    assert made.agent_pid and held() == ["here"]
    assert made.run("exit 0").wait(10) == 0
    made.close()
    assert not cold.direct


def test_a_long_command_hands_its_hosts_over_while_it_runs(
        cold: starter.Cold, monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[list[dict[str, Any]]] = []
    monkeypatch.setattr(starter, "hand_over", given.append)
    monkeypatch.setattr(starter, "HAND_OVER_AFTER", 0.1)
    cold.reached({"host": {"name": "gpu-a"}})
    wait_until(lambda: given, 5)
    cold.reached({"host": {"name": "gpu-c"}})  # reached later: handed over at exit
    cold.hand_over()
    assert given == [[{"host": {"name": "gpu-a"}}], [{"host": {"name": "gpu-c"}}]]


def test_session_shows_the_hosts_it_is_connecting(session_home: Path) -> None:
    gate = threading.Event()

    def slow(spec: HostSpec, options: SshOptions) -> Transport:
        gate.wait(30)
        return transport.direct(spec, options)

    served = daemon.Daemon(daemon.listen(str(paths.socket_path())), slow, 600)
    threading.Thread(target=served.serve, daemon=True).start()
    try:
        starter.hand_over([client.hello(LOCAL, SshOptions())])
        wait_until(lambda: (client.ask(frames.STATUS) or {}).get("connecting") == ["here"])
        cp = run_cli("session")
        assert cp.returncode == 0 and "here" in cp.stdout and "connecting" in cp.stdout, \
            cp.stdout + cp.stderr
        status = json.loads(run_cli("session", "--json").stdout)
        assert status["connecting"] == ["here"] and status["hosts"] == []
        assert status["idle"] == 0  # connecting counts as busy: no idle exit halfway
        gate.set()
        assert wait_until(held) == ["here"]
        assert (client.ask(frames.STATUS) or {})["connecting"] == []
    finally:
        gate.set()
        served.stop("test over")


# On the namespace cluster: the first command with no daemon logs in as the direct path does,
# the daemon started behind it holds its hosts a moment later, the next command logs in nowhere.

HOSTS = [f"node{k}" for k in range(24, 28)]


def logins(cluster: Cluster) -> dict[str, int]:
    return {n: sandbox.logins(cluster.sb, n) for n in HOSTS}


def since(cluster: Cluster, before: dict[str, int]) -> dict[str, int]:
    return {n: c - before[n] for n, c in logins(cluster).items()}


@pytest.mark.cluster
def test_the_first_command_goes_direct_and_the_next_finds_its_hosts_warm(
        cluster: Cluster, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERRUN_SESSION", "1")
    monkeypatch.delenv("CLUSTERRUN_SESSION_COLD", raising=False)
    inv = str(cluster.inventory(tmp_path / "inv.yaml", HOSTS))
    try:
        before = logins(cluster)
        cp = run_cli("exec", "--no-session", inv, "--", "hostname")
        assert cp.returncode == 0, cp.stderr
        direct_logins = since(cluster, before)

        before = logins(cluster)
        cp = run_cli("exec", inv, "--", "hostname")
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert sorted(cp.stdout.splitlines()) == [f"{n}: {n}" for n in HOSTS]

        def holding() -> dict[str, Any]:
            status = json.loads(run_cli("session", "--json").stdout)
            hosts = {h["name"] for h in status.get("hosts", []) if h["alive"]}
            return status if hosts == set(HOSTS) and not status["connecting"] else {}

        status = wait_until(holding, 60)
        # The command's own logins, as on the direct path, and the daemon's one per host.
        assert since(cluster, before) == {n: direct_logins[n] + 1 for n in HOSTS}

        before = logins(cluster)
        assert run_cli("check", inv).returncode == 0
        assert since(cluster, before) == dict.fromkeys(HOSTS, 0)
        before = logins(cluster)
        cp = run_cli("exec", inv, "--", "hostname")
        assert cp.returncode == 0, cp.stderr
        # exec's command runs in the user's shell (as under clush): that alone, no SSH login.
        assert since(cluster, before) == {n: direct_logins[n] - 1 for n in HOSTS}
        after = json.loads(run_cli("session", "--json").stdout)
        assert {h["name"]: h["agent_pid"] for h in after["hosts"]} == \
            {h["name"]: h["agent_pid"] for h in status["hosts"]}
    finally:
        run_cli("session", "stop", timeout=30)
        cluster.kill_all(HOSTS)
