"""Daemons the sandbox's add-ons start besides each host's sshd (Slurm's and dockerd, see
tests/support/), and their stopping, which sandbox.down() does first.

Each daemon is recorded in the sandbox state by pid and start time, so that any process, not
only the one that started it, can stop it later without ever signalling a reused pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from clusterrun.errors import SandboxError
from clusterrun.sandbox.state import DaemonRecord

STOP_TIMEOUT = 5.0

# Kept so that a daemon this process started is reaped when it ends: some machines' init
# (pid 1 in a container or a micro-VM) never reaps orphans, and a zombie lingers in `ps`.
_children: dict[int, subprocess.Popen[bytes]] = {}


def start(name: str, argv: Sequence[str], log: Path) -> DaemonRecord:
    """Start a daemon in the foreground (argv must exec it, not fork: the pid is the
    daemon's), its output appended to log; return its record for the sandbox state."""
    with log.open("ab") as out:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True)  # no signal from a terminal
        except OSError as exc:
            raise SandboxError(f"cannot start {name}: `{argv[0]}`: {exc.strerror}") from None
    _children[proc.pid] = proc
    start_time = _start_time(proc.pid)
    if start_time is None:  # it died at once; the record must still name it
        start_time = -1
    return DaemonRecord(name=name, pid=proc.pid, start=start_time)


def alive(record: DaemonRecord) -> bool:
    """Whether the recorded daemon still runs (a zombie does not)."""
    child = _children.get(record.pid)
    if child is not None and child.poll() is not None:
        return False
    return _start_time(record.pid) == record.start


def exit_status(record: DaemonRecord) -> int | None:
    """The daemon's exit status, where this process started it and it has ended."""
    child = _children.get(record.pid)
    return None if child is None else child.poll()


def stop(groups: Sequence[Sequence[DaemonRecord]],
         timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop the daemons one group after the other: SIGTERM, then SIGKILL for those still
    running after timeout. Return what survived, as error messages."""
    errors = []
    for group in groups:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
            live = [r for r in group if alive(r)]
            for record in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, sig)
            deadline = time.monotonic() + wait
            while live and time.monotonic() < deadline:
                time.sleep(0.01)
                live = [r for r in live if alive(r)]
            if not live:
                break
        else:
            errors += [f"{r.name} (pid {r.pid}) survives SIGKILL" for r in group if alive(r)]
    for pid, child in list(_children.items()):
        if child.poll() is not None:
            del _children[pid]
    return errors


def _start_time(pid: int) -> int | None:
    """When the process started (clock ticks after boot); None when there is none or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])
