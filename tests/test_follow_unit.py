"""`logs -f` resumes where the local mirrors end: what it asks each host for, with no host.

The mirror drops bytes it already has (mirror.Mirror.append), so a follower that asked every
host for its files from byte 0 would still end with the right mirrors: only the request shows
that it resumed. The cluster test (tests/test_logs.py) shows the same end to end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from clusterrun.logs import follow as follow_module
from clusterrun.logs.mirror import Mirror
from clusterrun.runs import store
from clusterrun.transport import SshOptions


class Stream:
    """A Process whose stdout is the given bytes, then its end."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def recv(self, size: int) -> bytes:
        head, self.payload = self.payload[:size], self.payload[size:]
        return head

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def close(self) -> None:
        return None


def event(obj: dict[str, Any]) -> bytes:
    return b"J " + json.dumps(obj).encode() + b"\n"


def data(name: str, offset: int, payload: bytes) -> bytes:
    return (b"D " + json.dumps({"f": name, "o": offset, "n": len(payload)}).encode() + b"\n"
            + payload)


# What each host's run folder holds: the rank files the fake tail serves from the asked offset.
HOSTS = {"node1": {"rank-0.log": b"".join(b"r0 line %04d\n" % i for i in range(200))},
         "node2": {"rank-1.log": b"".join(b"r1 line %04d\n" % i for i in range(300)),
                   "node.log": b"agent started\n"}}


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    made = Mirror(store.create(tmp_path / "home", "run-1"))
    yield made
    made.close()


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """Every host's tail.py request, as follow sends it; the fake tail answers from there."""
    requests: dict[str, dict[str, Any]] = {}

    def start(transport: object, spec: Any, program: str, request: dict[str, Any],
              chain: bool = False) -> SimpleNamespace:
        assert program == "tail.py"
        requests[spec.name] = json.loads(json.dumps(request))  # as it crosses the wire
        offsets = request.get("offsets") or {}
        frames = b"".join(data(name, offsets.get(name, 0), whole[offsets.get(name, 0):])
                          for name, whole in HOSTS[spec.name].items())
        return SimpleNamespace(proc=Stream(frames + event({"ev": "end", "state": "succeeded"})))

    def each_node(run: object, ssh: object, fn: Callable[[Any, Any, Any], None],
                  deadline: object) -> list[SimpleNamespace]:
        for name in HOSTS:
            fn(None, SimpleNamespace(name=name), SimpleNamespace(rundir=f"/hosts/{name}/run-1"))
        return [SimpleNamespace(failure=None, spec=SimpleNamespace(name=n)) for n in HOSTS]

    monkeypatch.setattr(follow_module, "start", start)
    monkeypatch.setattr(follow_module, "each_node", each_node)
    return requests


def test_a_resumed_follow_asks_each_host_only_for_what_the_mirror_lacks(
        mirror: Mirror, asked: dict[str, dict[str, Any]]) -> None:
    # A first follower was killed part-way: node1's rank file is half here, node2's a third,
    # and node2's agent log not at all.
    mirror.append("node1", "rank-0.log", 0, HOSTS["node1"]["rank-0.log"][:1300])
    mirror.append("node2", "rank-1.log", 0, HOSTS["node2"]["rank-1.log"][:1000])
    ends = follow_module.follow(mirror.run, SshOptions(), mirror, None, print)
    assert asked["node1"]["offsets"] == {"rank-0.log": 1300}
    assert asked["node2"]["offsets"] == {"rank-1.log": 1000}
    assert all(request["follow"] is True for request in asked.values())
    for node, files in HOSTS.items():
        for name, whole in files.items():
            assert mirror.run.mirror(node, name).read_bytes() == whole
    assert set(ends) == {"node1", "node2"}


def test_a_first_follow_asks_from_the_start(mirror: Mirror,
                                            asked: dict[str, dict[str, Any]]) -> None:
    follow_module.follow(mirror.run, SshOptions(), mirror, None, print, keep_following=False)
    assert asked == {"node1": {"rundir": "/hosts/node1/run-1", "follow": False, "offsets": {}},
                     "node2": {"rundir": "/hosts/node2/run-1", "follow": False, "offsets": {}}}
