"""``facts["limits"]`` and ``facts["infiniband"]`` as the probe sends them
(clusterrun/remote/probe/sysinfo.py), read once into frozen values for preflight/limits.py::

    "limits": {"nofile": [65536, 1048576],    # [soft, hard]; None: unlimited
               "memlock": [None, None], "stack": [8388608, None],
               "shm": {"size": 34359738368, "free": 34359738368}},  # None: /dev/shm unread
    "infiniband": {"mlx5_0": {"1": {"state": "ACTIVE", "link_layer": "InfiniBand",
                                    "rate": "200 Gb/sec (4X HDR)"}}}  # None: no RDMA stack
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from clusterrun.jsonfields import integer, obj, text


@dataclass(frozen=True)
class Rlimit:
    """A resource limit; None: unlimited."""

    soft: Optional[int]
    hard: Optional[int]

    @classmethod
    def from_json(cls, value: object) -> Optional[Rlimit]:
        """None (unknown) unless the probe sent [soft, hard]."""
        if not isinstance(value, list) or len(value) < 2:
            return None
        return cls(integer(value[0]), integer(value[1]))


@dataclass(frozen=True)
class Limits:
    """The limits the job runs under; each None when the probe did not send it. ``shm``:
    the size of /dev/shm in bytes."""

    nofile: Optional[Rlimit] = None
    memlock: Optional[Rlimit] = None
    stack: Optional[Rlimit] = None
    shm: Optional[int] = None

    @classmethod
    def from_json(cls, value: object) -> Limits:
        found = obj(value)
        shm = obj(found.get("shm"))
        # A /dev/shm entry without a size reads as 0 bytes, as the check always took it.
        return cls(Rlimit.from_json(found.get("nofile")), Rlimit.from_json(found.get("memlock")),
                   Rlimit.from_json(found.get("stack")),
                   (integer(shm.get("size")) or 0) if shm else None)


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device, as /sys/class/infiniband shows it."""

    state: Optional[str] = None
    link_layer: Optional[str] = None
    rate: Optional[str] = None

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @classmethod
    def from_json(cls, value: object) -> IbPort:
        found = obj(value)
        return cls(text(found.get("state")), text(found.get("link_layer")),
                   text(found.get("rate")))


def infiniband(reply: Mapping[str, object]) -> Optional[Mapping[str, Mapping[str, IbPort]]]:
    """device -> port -> IbPort; {} when the host has no RDMA stack (the probe sends null),
    None when the probe did not report RDMA devices at all (unknown)."""
    if "infiniband" not in reply:
        return None
    return {str(dev): {str(port): IbPort.from_json(item) for port, item in obj(ports).items()}
            for dev, ports in obj(reply["infiniband"]).items()}
