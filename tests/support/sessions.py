"""The warm session's daemons as the tests see them (docs/session.md).

A live daemon keeps one resident agent per host, carried by one sshd session, between
commands: those two are the session's and not a test's leftovers, so the leftover checks
(``Cluster.pids``) leave them out, but only while the daemon that holds them lives. A daemon
that died, an agent it no longer holds, and everything an agent started still count.

Each daemon a test run starts carries RUN_MARK in its environment (inherited from this
process through the CLI that started it), which is how ``stop_ours`` ends this run's daemons,
whatever $CLUSTERRUN_HOME they serve, and nobody else's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from clusterrun.errors import ClusterrunError
from clusterrun.session import client

MARK_VAR = "CLUSTERRUN_TEST_RUN"
RUN_MARK = uuid.uuid4().hex  # one per process: each xdist worker ends only its own daemons
os.environ[MARK_VAR] = RUN_MARK
_DAEMON = b"clusterrun.session.daemon"
_LISTENING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags
_SOCKET = re.compile(r"/sock-[0-9a-f]+$")  # a daemon's socket (clusterrun/session/paths.py)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # it exited meanwhile
        return b""


def _unix_listeners() -> list[tuple[str, str]]:
    """(inode, path) of every Unix socket listening on this machine (its network namespace)."""
    found = []
    for line in _read("/proc/net/unix").decode(errors="replace").splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and int(cols[3], 16) & _LISTENING:
            found.append((cols[6], cols[7]))
    return found


def ours() -> list[int]:
    """The pids of the session daemons this test run started (RUN_MARK in their environment)."""
    if not any(_SOCKET.search(path) for _, path in _unix_listeners()):
        return []  # no daemon listens anywhere: the walk through /proc is not needed
    mark = f"{MARK_VAR}={RUN_MARK}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _DAEMON in _read(f"/proc/{entry}/cmdline") \
                and mark in _read(f"/proc/{entry}/environ").split(b"\0"):
            found.append(int(entry))
    return found


def _listening_sockets(pid: int) -> list[str]:
    """The paths of the Unix sockets this process listens on."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return [path for inode, path in _unix_listeners() if inode in inodes]


def agent_pids() -> set[int]:
    """The agents that this run's live daemons hold, on any host."""
    held: set[int] = set()
    for pid in ours():
        for path in _listening_sockets(pid):
            with contextlib.suppress(ClusterrunError, OSError, ValueError):
                status = client.ask("status", path) or {}
                held.update(int(h["agent_pid"]) for h in status.get("hosts", [])
                            if h.get("alive") and h.get("agent_pid"))
    return held


def _parent(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat")
    return int(stat.rsplit(b")", 1)[1].split()[1]) if stat else 0


def carried(pids: Iterable[int]) -> set[int]:
    """Of a host's processes (``pids``), the session's own: each live agent and the sshd
    session processes between it and the host's sshd listener (which ``pids`` leaves out)."""
    there = set(pids)
    found: set[int] = set()
    for agent in agent_pids() & there:
        found.add(agent)
        parent = _parent(agent)
        while parent in there and _read(f"/proc/{parent}/cmdline").startswith(b"sshd"):
            found.add(parent)
            parent = _parent(parent)
    return found


def stop_ours(timeout: float = 10) -> list[int]:
    """End this run's daemons as `clusterrun session stop` does (SIGTERM: each closes its
    agents' channels, they exit on EOF), SIGKILL any still there after ``timeout``; the pids
    that were running."""
    daemons = ours()
    agents = agent_pids() if daemons else set()
    for pid in daemons:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while (left := [p for p in daemons if Path(f"/proc/{p}").exists() and not _zombie(p)]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # The agents exit on their channel's EOF: wait for it, so that the next test's leftover
    # checks never see one on its way out (one that stays is a leftover they report).
    while any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in agents) \
            and time.monotonic() < deadline + timeout:
        time.sleep(0.05)
    return daemons


def _zombie(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return not stat or stat.rsplit(b")", 1)[1].split()[0] == b"Z"
