"""The all-pairs phase's cost on the hosts (no root): each host's name lookups run on a few
threads under one deadline, and the probe runs `mesh_connect` and `resolve` at once when they
arrive together, answering in request order. What the mesh finds is in test_preflight_hosts.py
and, on the namespace cluster, in test_preflight_cluster.py and tests/reliability/."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterrun.preflight import checks as preflight
from clusterrun.preflight import mesh
from clusterrun.remote.probe import sysinfo
from clusterrun.transport import SshOptions, parallel, shell
from clusterrun.transport.fake import FakeNetwork, Interface
from clusterrun.transport.pool import Connections
from tests.conftest import fake_inventory, host_spec


class Resolver:
    """A stand-in for getaddrinfo: every name takes ``seconds``; names starting "hang" never
    answer (until released). Counts how many lookups run at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, name: str, *_args: Any) -> list[Any]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if name.startswith("hang"):
                self.release.wait(30)
            time.sleep(self.seconds)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"10.1.0.{len(name)}", 0))]
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    fake = Resolver(0.02)
    monkeypatch.setattr(sysinfo.socket, "getaddrinfo", fake)
    yield fake
    fake.release.set()


def test_resolve_many_looks_up_every_name_on_at_most_its_workers(resolver: Resolver) -> None:
    names = [f"node{n}" for n in range(1, 129)]
    found = sysinfo.resolve_many([*names, "node1"], 5.0, workers=8)
    assert sorted(found) == sorted(names)
    assert found["node7"]["addresses"] == ["10.1.0.5"] and found["node7"]["error"] is None
    assert found["node7"]["seconds"] >= 0.02
    assert 2 <= resolver.most <= 8  # in parallel, but never a thread per name


def test_resolve_many_answers_by_its_deadline_when_lookups_hang(resolver: Resolver) -> None:
    """The hung lookups end only after the test (the fixture releases them): that it answers
    at all shows it never waits for them."""
    start = time.monotonic()
    found = sysinfo.resolve_many(["alpha", "beta", "hang1", "hang2"], 0.5, workers=3)
    assert time.monotonic() - start >= 0.5  # it gave them their time
    assert found["alpha"]["addresses"] and found["beta"]["addresses"]
    for name in ("hang1", "hang2"):
        assert found[name] == {"addresses": [], "error": "no answer within 0.5 s",
                               "seconds": None}
    # Every worker stuck: the names behind them are never looked up, and say so in time.
    found = sysinfo.resolve_many(["hang1", "hang2", "zeta"], 0.3, workers=2)
    assert found["zeta"]["error"] == "no answer within 0.3 s"


def _unanswered_port() -> tuple[socket.socket, list[socket.socket], int]:
    """A port whose accept queue is full: the kernel drops further SYNs, so a connect to it
    hangs until its timeout, as to a host behind a firewall that drops."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.2)
    return server, fillers, port


def test_the_probe_runs_requests_sent_together_at_once_and_answers_in_order(
        tmp_path: Path) -> None:
    server, fillers, port = _unanswered_port()
    probe = subprocess.Popen([sys.executable, "-u", "-c", shell.BOOTSTRAP],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
    assert probe.stdin is not None and probe.stdout is not None
    try:
        probe.stdin.write(shell.program_input("probe.py", {"workdir": str(tmp_path / "wd")}))
        probe.stdin.flush()
        assert "facts" in json.loads(probe.stdout.readline())
        slow = {"targets": [["blocked", "127.0.0.1", port]], "src": "127.0.0.1",
                "timeout": 2.0}
        requests = [{"op": "mesh_connect", **slow}, {"op": "mesh_connect", **slow},
                    {"op": "resolve", "names": ["localhost"], "timeout": 1.0},
                    {"op": "peers"}]
        start = time.monotonic()
        probe.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        probe.stdin.flush()
        replies = [json.loads(probe.stdout.readline()) for _ in requests]
        took = time.monotonic() - start
        assert [next(iter(r)) for r in replies] == ["mesh_connect", "mesh_connect", "resolve",
                                                   "peers"]
        for reply in replies[:2]:
            assert reply["mesh_connect"]["blocked"]["error"] == "timed out after 2 s"
        assert replies[2]["resolve"]["localhost"]["error"] is None
        # Each connect waits its whole 2 s: one after the other they take 4 s at least, at
        # once a little over 2 (the margin is for a loaded machine).
        assert 2.0 <= took < 4.0
        probe.stdin.write(b'{"op": "exit"}\n')
        probe.stdin.flush()
        assert probe.wait(10) == 0
    finally:
        probe.kill()
        probe.wait()
        server.close()
        for filler in fillers:
            filler.close()


def test_the_mesh_asks_every_host_at_once_whatever_the_default_fanout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions are open and each request is one message: a cap only makes the last hosts
    wait for the first ones' connect timeouts."""
    calls: list[tuple[int, int]] = []

    class Capped:
        """``parallel`` as the mesh sees it, with a default fan-out of 2."""

        @staticmethod
        def run(fn: Any, items: Any, deadline: Any, fanout: int = 2, **kw: Any) -> Any:
            calls.append((len(items), fanout))
            return parallel.run(fn, items, deadline, fanout, **kw)

    monkeypatch.setattr(mesh, "parallel", Capped)
    net = FakeNetwork()
    for n in range(1, 6):
        net.add(f"10.0.0.{n}", Interface("eth0", f"10.0.0.{n}/24"), hostname=f"node{n}")
    inv = fake_inventory(tmp_path, *[host_spec(f"10.0.0.{n}", f"node{n}") for n in range(1, 6)])
    with Connections(SshOptions(connect_timeout=1.0), connector=net.connect) as pool:
        report = preflight.run(inv, pool)
    assert report.ok and report.pairs is not None and len(report.pairs.hosts) == 5
    assert len(calls) == 2 and all(fanout >= items == 5 for items, fanout in calls), calls
