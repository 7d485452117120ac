"""The connections one command holds to the hosts of the runs it reaches (`ps`, `logs`, `stop`,
`stacks`, `top`): one per host for the whole command, whatever it asks in turn (`stop`: stop.py,
then status.py, then the logs), so each program runs in the interpreter the one before left
there (transport.programs) and the host pays its login shell once.

``held()`` owns them: cli.main opens it around every command and closes them when the command
ends (a launch holds its own ``Connections`` the same way). runs/remote.py takes its pools from
it; a caller outside any command (a library user, a test calling one step) gets a pool for that
one step, closed when the step is done. This module imports nothing heavy: every command opens
it, also those that never connect.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from clusterrun.transport.base import SshOptions
    from clusterrun.transport.pool import Connections


class Held:
    """The command's pools, one per set of SSH options (a command uses one)."""

    def __init__(self) -> None:
        self._pools: dict[SshOptions, Connections] = {}
        self._lock = threading.Lock()  # `logs -f` follows each host from a thread of its own

    def pool(self, ssh: SshOptions, make: Callable[[SshOptions], Connections]) -> Connections:
        with self._lock:
            if ssh not in self._pools:
                self._pools[ssh] = make(ssh)
            return self._pools[ssh]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


_holder: list[Held] = []  # the command's, while it runs (one command per process)


@contextmanager
def held() -> Iterator[Held]:
    """The command's connections, closed when it ends. Opened again inside (a command that
    runs another's code), the outer one stays the owner."""
    if _holder:
        yield _holder[0]
        return
    owner = Held()
    _holder.append(owner)
    try:
        yield owner
    finally:
        _holder.clear()
        owner.close()


def current() -> Optional[Held]:
    """The command's connections, if a command holds them."""
    return _holder[0] if _holder else None
