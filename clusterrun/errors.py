"""Exit statuses and the exception tree: library code raises, only the CLI exits."""

from __future__ import annotations

import enum
from typing import ClassVar


class ExitStatus(enum.IntEnum):
    """Every exit status clusterrun itself produces (docs/exit-status.md).

    A failed job exits with its root-cause rank's own code instead, so codes
    1..255 can also come from the training script; ``summary.json`` tells which.
    """

    SUCCESS = 0
    ERROR = 1  # unexpected internal error (a bug: please report it)
    USAGE = 2  # bad arguments or inventory; nothing was contacted
    PREFLIGHT = 3  # a host failed a preflight check; nothing was started
    UNREACHABLE = 4  # a host could not be reached, authenticated or trusted
    NODE_LOST = 5  # a node stopped answering or its supervisor died mid-run
    SIGINT = 130  # 128 + SIGINT: Ctrl-C
    SIGTERM = 143  # 128 + SIGTERM


class ClusterrunError(Exception):
    """An error a user can act on: its message is shown as-is, without a traceback."""

    exit_status: ClassVar[int] = ExitStatus.ERROR

    def __init__(self, message: str, *, exit_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_status is not None:
            self.exit_status = exit_status


class UsageError(ClusterrunError):
    exit_status = ExitStatus.USAGE


class InventoryError(UsageError):
    """The inventory file is missing, malformed or fails validation."""


class PreflightError(ClusterrunError):
    exit_status = ExitStatus.PREFLIGHT


class UnreachableError(ClusterrunError):
    exit_status = ExitStatus.UNREACHABLE


class SandboxError(ClusterrunError):
    """The local sandbox cluster cannot be built or removed here."""
