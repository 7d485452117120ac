"""One refresh of `clusterrun top`: every host's and every rank's figures as typed values, the
flags a user should look at first, and the JSON `top --json` prints (docs/observability.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

# A host is "ok" while it answers, "connecting" before its first answer, "lost" once it has
# missed answers for two refresh intervals (or its connection closed).
OK, CONNECTING, LOST = "ok", "connecting", "lost"
# A node's supervisor state once its part of the run is over (else: running, stalled ...).
ENDED = ("succeeded", "failed", "stopped", "lost")

# A rank is flagged "slow" when it prints at under this share of the median rate of the ranks
# that print, and "silent" when it has said nothing for SILENT_FACTOR times as long as the
# median rank and at least SILENT_MIN seconds (ranks of a synchronous job keep one pace, so
# either means one rank is holding the others up, or has stopped).
SLOW_SHARE = 0.5
SILENT_FACTOR = 3.0
SILENT_MIN = 30.0


@dataclass(frozen=True)
class Gpu:
    index: Optional[int]
    util_percent: Optional[int]
    mem_used_mb: Optional[int]
    mem_total_mb: Optional[int]
    temp_c: Optional[int]
    power_w: Optional[float]
    throttle: Optional[list[str]] = None  # clock throttle reasons now active
    ecc_errors: Optional[int] = None  # uncorrected, volatile

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Gpu:
        return cls(**{k: raw.get(k) for k in cls.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "util_percent": self.util_percent,
                "mem_used_mb": self.mem_used_mb, "mem_total_mb": self.mem_total_mb,
                "temp_c": self.temp_c, "power_w": self.power_w}


@dataclass
class HostSample:
    node: str
    status: str = CONNECTING
    reason: str = ""  # why it is lost
    node_state: str = ""  # the supervisor's state there (running, succeeded, lost ...)
    cpu_percent: Optional[float] = None
    mem_used_mb: Optional[int] = None
    mem_total_mb: Optional[int] = None
    load: Optional[list[float]] = None
    interface: str = ""
    net_rx_mbps: Optional[float] = None
    net_tx_mbps: Optional[float] = None
    disk_free_mb: Optional[int] = None
    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: Optional[str] = None

    @classmethod
    def from_reply(cls, node: str, interface: str, host: dict[str, Any]) -> HostSample:
        return cls(node=node, status=OK, node_state=str(host.get("state") or ""),
                   cpu_percent=host.get("cpu_percent"), mem_used_mb=host.get("mem_used_mb"),
                   mem_total_mb=host.get("mem_total_mb"), load=host.get("load"),
                   interface=interface if host.get("interface_found") else "",
                   net_rx_mbps=host.get("net_rx_mbps"), net_tx_mbps=host.get("net_tx_mbps"),
                   disk_free_mb=host.get("disk_free_mb"),
                   gpus=[Gpu.parse(g) for g in host.get("gpus") or []],
                   gpu_error=host.get("gpu_error"))

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "cpu_percent": self.cpu_percent,
                "mem_used_mb": self.mem_used_mb, "mem_total_mb": self.mem_total_mb,
                "net_rx_mbps": self.net_rx_mbps, "net_tx_mbps": self.net_tx_mbps,
                "gpus": [g.to_json() for g in self.gpus]}


@dataclass
class RankSample:
    rank: int
    node: str
    pid: Optional[int] = None
    cpu_percent: Optional[float] = None
    rss_mb: Optional[float] = None
    lines_per_min: Optional[float] = None
    last_line: Optional[str] = None
    silent_s: Optional[float] = None
    flags: list[str] = field(default_factory=list)
    wait_share: Optional[float] = None  # with --profile: share of samples in collectives

    @classmethod
    def from_reply(cls, node: str, raw: dict[str, Any]) -> RankSample:
        return cls(rank=int(raw["rank"]), node=node, pid=raw.get("pid"),
                   cpu_percent=raw.get("cpu_percent"), rss_mb=raw.get("rss_mb"),
                   lines_per_min=raw.get("lines_per_min"), last_line=raw.get("last_line"),
                   silent_s=raw.get("silent_s"))

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "pid": self.pid,
                "cpu_percent": self.cpu_percent, "rss_mb": self.rss_mb,
                "lines_per_min": self.lines_per_min, "last_line": self.last_line,
                "silent_s": self.silent_s}


@dataclass
class Frame:
    run: str
    run_state: str  # as recorded on this machine (running, stalled, succeeded ...)
    interval: float
    hosts: list[HostSample]
    ranks: list[RankSample]
    stragglers: Optional[list[int]] = None  # with --profile

    @property
    def ended(self) -> bool:
        """Every host answered and every node's supervisor has ended its part."""
        return bool(self.hosts) and all(
            h.status == OK and h.node_state in ENDED for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        """DESIGN.md's shape of `top --once --json`."""
        return {"run": self.run, "hosts": [h.to_json() for h in self.hosts],
                "ranks": [r.to_json() for r in self.ranks]}


def flag_ranks(ranks: list[RankSample]) -> None:
    """Mark the ranks that fall behind the others' pace (see SLOW_SHARE, SILENT_FACTOR)."""
    rates = [r.lines_per_min for r in ranks if r.lines_per_min]
    silences = [r.silent_s for r in ranks if r.silent_s is not None]
    median_rate = statistics.median(rates) if len(rates) >= 2 else None
    median_silent = statistics.median(silences) if len(silences) >= 2 else None
    for rank in ranks:
        rank.flags = [f for f in rank.flags if f not in ("slow", "silent")]
        # A rank that prints nothing is not compared (scripts often print on rank 0 only);
        # one that stopped printing turns "silent" instead.
        if median_rate and rank.lines_per_min and rank.lines_per_min < SLOW_SHARE * median_rate:
            rank.flags.append("slow")
        if (median_silent is not None and rank.silent_s is not None
                and rank.silent_s >= SILENT_MIN
                and rank.silent_s > SILENT_FACTOR * max(median_silent, 1.0)):
            rank.flags.append("silent")
