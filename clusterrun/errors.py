"""Every outcome a user can cause, its exit status, and the one exception family that carries it.

Library code raises; only the command line (cli.py) turns an exception into an exit status. The
table in docs/exit-status.md is checked against ``ExitStatus`` by the test suite.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional


class ExitStatus(enum.IntEnum):
    """Every exit status clusterrun itself produces (docs/exit-status.md).

    A failed job exits with its root-cause rank's own code instead, so codes 1..255 can also come
    from the training script; ``summary.json`` tells which.
    """

    SUCCESS = 0
    ERROR = 1  # unexpected internal error (a bug: please report it)
    USAGE = 2  # bad arguments, inventory or local files; nothing was contacted
    PREFLIGHT = 3  # a host answered but failed a check; nothing was started
    UNREACHABLE = 4  # a host could not be reached, authenticated or trusted
    NODE_LOST = 5  # a node stopped answering or its supervisor died mid-run
    SYNC = 6  # copying the code to a host failed (rsync or the copy over SSH, disk full), or a
    # host's disk filled up under the run directory mid-run (the run was stopped:
    # remote/shared/diskfloor.py)
    STALLED = 7  # the stall watchdog found no rank making progress and --on-stall stop ended it
    TIMEOUT = 124  # `exec --timeout` ran out on some host (as timeout(1) reports it)
    SIGINT = 130  # 128 + SIGINT: Ctrl-C
    SIGTERM = 143  # 128 + SIGTERM


class HostStatus(enum.IntEnum):
    """Statuses clusterrun's own wrappers exit with on a host, read back by the controller
    (docs/exit-status.md, "On the hosts")."""

    DISK_FULL = ExitStatus.SYNC  # remote/shared/diskfloor.py: the run directory's disk filled up
    ENGINE_MISSING = 96  # a `container:` host has neither docker nor podman
    SETUP_FAILED = 97  # the inventory's `setup:` failed there


class Outcome(enum.Enum):
    """What happened, in words a user reads (``label``), and the exit status it gives."""

    def __init__(self, label: str, status: ExitStatus) -> None:
        self.label = label
        self.status = status

    USAGE = ("usage", ExitStatus.USAGE)
    INVENTORY = ("inventory", ExitStatus.USAGE)
    LOCAL_FILES = ("local files", ExitStatus.USAGE)  # $CLUSTERRUN_HOME, known_hosts, keys
    DNS = ("dns", ExitStatus.UNREACHABLE)
    REFUSED = ("refused", ExitStatus.UNREACHABLE)
    CONNECT_TIMEOUT = ("timeout", ExitStatus.UNREACHABLE)
    UNREACHABLE = ("unreachable", ExitStatus.UNREACHABLE)
    AUTH = ("auth", ExitStatus.UNREACHABLE)
    HOST_KEY = ("host key", ExitStatus.UNREACHABLE)
    CONNECTION_LOST = ("connection lost", ExitStatus.UNREACHABLE)
    PROBE_FAILED = ("probe failed", ExitStatus.PREFLIGHT)
    PROBE_TIMEOUT = ("probe timeout", ExitStatus.PREFLIGHT)
    PREFLIGHT = ("preflight", ExitStatus.PREFLIGHT)
    SYNC = ("sync", ExitStatus.SYNC)
    JOB_FAILED = ("job failed", ExitStatus.ERROR)  # the status is the root-cause rank's own
    NODE_LOST = ("node lost", ExitStatus.NODE_LOST)
    STALLED = ("stalled", ExitStatus.STALLED)
    COMMAND_TIMEOUT = ("command timeout", ExitStatus.TIMEOUT)
    INTERRUPTED = ("interrupted", ExitStatus.SIGINT)
    TERMINATED = ("terminated", ExitStatus.SIGTERM)
    SANDBOX = ("sandbox", ExitStatus.USAGE)  # the local sandbox cannot be built or removed here
    INTERNAL = ("internal error", ExitStatus.ERROR)

    @property
    def reached(self) -> bool:
        """False for the outcomes where the host was never reached (nothing ran there)."""
        return self.status is not ExitStatus.UNREACHABLE


class ClusterrunError(Exception):
    """An error a user can act on: its message is shown as-is, without a traceback."""

    outcome: Outcome = Outcome.INTERNAL

    def __init__(self, message: str, *, outcome: Optional[Outcome] = None) -> None:
        super().__init__(message)
        self.message = message
        if outcome is not None:
            self.outcome = outcome

    @property
    def exit_status(self) -> int:
        """The outcome's status."""
        return int(self.outcome.status)

    @property
    def kind(self) -> str:
        return self.outcome.label


class UsageError(ClusterrunError):
    outcome = Outcome.USAGE


class InventoryError(UsageError):
    """The inventory file is missing, malformed or fails validation."""

    outcome = Outcome.INVENTORY


class LocalFilesError(UsageError):
    """A file or directory on this machine cannot be used ($CLUSTERRUN_HOME, known_hosts)."""

    outcome = Outcome.LOCAL_FILES


class PreflightError(ClusterrunError):
    outcome = Outcome.PREFLIGHT


class UnreachableError(ClusterrunError):
    outcome = Outcome.UNREACHABLE


class SyncError(ClusterrunError):
    outcome = Outcome.SYNC


class SandboxError(ClusterrunError):
    """The local sandbox cluster cannot be built or removed here."""

    outcome = Outcome.SANDBOX


@dataclass(frozen=True)
class Result:
    """What a command came to. Commands return one; the command line turns it into the exit
    status with ``exit_status``, the one mapping."""

    interrupted: Optional[int] = None  # the signal (SIGINT, SIGTERM) that stopped it
    unreachable: bool = False  # a host could not be reached, authenticated or trusted
    failed_check: bool = False  # a host answered and failed a preflight check
    cause: Optional[Outcome] = None  # what ended a run: JOB_FAILED (``code``), NODE_LOST, ...
    code: int = 0  # JOB_FAILED: the root-cause rank's own status; exec: the largest of the hosts'
    stopped: bool = False  # ended from outside (`clusterrun stop`)


# The precedence, first match wins (docs/exit-status.md says the same): the user's signal; a
# host that could not be reached; a failed check; what ended a run; the hosts' own statuses; a
# stop from outside; success.
def exit_status(result: Result) -> int:
    """The exit status for ``result``."""
    if result.interrupted is not None:
        return 128 + result.interrupted
    if result.unreachable:
        return int(ExitStatus.UNREACHABLE)
    if result.failed_check:
        return int(ExitStatus.PREFLIGHT)
    if result.cause is not None and result.cause is not Outcome.JOB_FAILED:
        return int(result.cause.status)
    if result.cause is Outcome.JOB_FAILED or result.code:  # a job's or the hosts' own status
        return result.code if 0 < result.code < 256 else int(ExitStatus.ERROR)
    return int(ExitStatus.SIGTERM if result.stopped else ExitStatus.SUCCESS)
