"""The connection pool: one connection per host, however many threads ask for it at once."""

from __future__ import annotations

import threading
import time
from typing import Any

from clusterrun.inventory import HostSpec
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
