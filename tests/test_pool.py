"""The connection pool: one connection per host, however many threads ask for it at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from clusterrun.inventory import HostSpec
from clusterrun.runs import connections, remote, store
from clusterrun.transport.base import SshOptions
from clusterrun.transport.pool import Connections


def test_threads_asking_for_one_host_at_once_share_one_handshake() -> None:
    made: list[str] = []
    failures = [1]  # the first handshake fails: the next get() tries again

    def connect(spec: HostSpec, _options: SshOptions) -> Any:
        time.sleep(0.2)
        if failures:
            failures.pop()
            raise OSError("refused")
        made.append(spec.name)
        return object()

    spec = HostSpec(host="10.0.0.1", name="gpu-a", master=True, line=1)
    pool = Connections(SshOptions(), connector=connect)
    got: list[Any] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            got.append(pool.get(spec))
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 1  # the one that ran the failed handshake
    assert made == ["gpu-a"] and len(got) == 4 and all(t is got[0] for t in got)
    assert pool.transports == {"gpu-a": got[0]}


class _CountedPool:
    """A pool that connects nowhere and remembers whether it was closed."""

    made: ClassVar[list[_CountedPool]] = []

    def __init__(self, _options: SshOptions) -> None:
        self.closed = False
        _CountedPool.made.append(self)

    def get(self, spec: HostSpec) -> str:
        assert not self.closed, "a step used a pool its owner had closed"
        return spec.name

    def discard(self, _name: str) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_command_holds_its_connections_and_closes_them_when_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of a command reaches a run's hosts over one pool, which the command's
    ``held()`` closes when it ends; a step outside any command closes its own."""
    run = store.create(tmp_path, "20260301-120000-train-abcd")
    nodes = [{"name": n, "host": f"10.0.0.{i}", "node_rank": i} for i, n in enumerate("ab")]
    store.write_json(run.file("plan.json"), {"nodes": nodes})
    monkeypatch.setattr(remote, "Connections", _CountedPool)
    _CountedPool.made.clear()

    def step() -> list[str]:
        results = remote.each_node(run, SshOptions(), lambda t, _s, _n: t, None)
        return sorted(str(r.value) for r in results)

    with connections.held():
        assert step() == ["a", "b"] and step() == ["a", "b"]
        assert len(_CountedPool.made) == 1 and not _CountedPool.made[0].closed
    assert _CountedPool.made[0].closed and connections.current() is None
    assert step() == ["a", "b"]
    assert len(_CountedPool.made) == 2 and _CountedPool.made[1].closed
