"""The open connections of one command: made on first use, shared by every step that follows
(check -> sync -> start reuse them), all closed when the command is done."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Callable, Optional

from clusterrun.inventory import HostSpec
from clusterrun.transport import connect as connect_host
from clusterrun.transport import programs
from clusterrun.transport.base import SshOptions, Transport

Connector = Callable[[HostSpec, SshOptions], Transport]


class Connections:
    """``with Connections(options) as pool: pool.get(spec)``. Thread-safe: hosts connect in
    parallel; a host that fails to connect is tried again on the next ``get``."""

    def __init__(self, options: SshOptions, connector: Optional[Connector] = None) -> None:
        self.options = options
        self._connect = connector or connect_host
        self._open: dict[str, Transport] = {}
        self._lock = threading.Lock()
        self._gates: dict[str, threading.Lock] = {}  # one handshake per host at a time

    def get(self, spec: HostSpec) -> Transport:
        with self._lock:
            found = self._open.get(spec.name)
            gate = self._gates.setdefault(spec.name, threading.Lock())
        if found is not None:
            return found
        # Two steps asking for one host at once (preflight and an early sync, say) share one
        # connection: the second waits for the first's handshake instead of making its own.
        with gate:
            with self._lock:
                found = self._open.get(spec.name)
            if found is not None:
                return found
            # Outside the pool's lock: hosts connect in parallel (as many as connect() lets).
            transport = self._connect(spec, self.options)
            with self._lock:
                self._open[spec.name] = transport
            return transport

    def discard(self, name: str) -> None:
        """Close and forget a host's connection (a host left out of the run): a later ``get``
        connects afresh."""
        with self._lock:
            transport = self._open.pop(name, None)
        if transport is not None:
            programs.release(transport)
            transport.close()

    def connected(self, name: str) -> bool:
        with self._lock:
            return name in self._open

    @property
    def transports(self) -> dict[str, Transport]:
        with self._lock:
            return dict(self._open)

    def close(self) -> None:
        with self._lock:
            open_now, self._open = list(self._open.values()), {}
        programs.release(*open_now)  # what waits for a next program ends before its connection
        for transport in open_now:
            transport.close()

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
