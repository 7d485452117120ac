"""What NCCL chose on each host, told once: a line per host when that host's ranks have all
initialised their communicator (or the run ends first, or they take too long), then what looks
wrong across hosts once every host is up (or the run has ended):

    nccl gpu-a: eth1 10.0.0.11, IB (mlx5_0:1), GPUDirect RDMA on, 8/8 ranks init done
    nccl warning: gpu-c uses Socket (TCP) while gpu[a-b] use IB ...

The hosts' supervisors read NCCL's own log files (clusterrun/remote/node/nccllog.py) and send a
``wire.NcclReport`` whenever it changes. Nothing is said for a run that never used NCCL (gloo).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

from clusterrun.inventory.ranges import fold
from clusterrun.remote.shared import timing
from clusterrun.wire import NcclReport

# How long a host's ranks may take from its first NCCL report to all being initialised before
# the stragglers are named while the run goes on (large jobs take a minute at most).
INIT_PATIENCE = 120.0
SHOWN_DEVICES = 4


@dataclass(frozen=True)
class HostNccl:
    """One host's part: its global ranks and its latest report (None: no NCCL log yet)."""

    name: str
    ranks: range
    report: Optional[NcclReport]

    @property
    def missing(self) -> list[int]:
        done = set(self.report.init_done) if self.report is not None else set()
        return [r for r in self.ranks if r not in done]


def is_ib(network: str) -> bool:
    """IB and the IB plugins (IBext, IBext_v8, ...): RDMA, not NCCL's TCP sockets."""
    return network.upper().startswith("IB")


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _devices(devices: Sequence[str]) -> str:
    """``mlx5_0:1/IB`` -> ``mlx5_0:1``; other link layers stay named (``mlx5_4:1 RoCE``)."""
    shown = [d.replace("/IB", "").replace("/", " ", 1) for d in devices[:SHOWN_DEVICES]]
    more = len(devices) - SHOWN_DEVICES
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def _network(report: NcclReport) -> str:
    if not report.networks:
        return "network not reported yet"
    text = "/".join(report.networks)
    if any(is_ib(n) for n in report.networks) and report.devices:
        text += f" ({_devices(report.devices)})"
    return text


def host_line(host: HostNccl) -> str:
    """``nccl gpu-a: eth1 10.0.0.11, IB (mlx5_0:1), GPUDirect RDMA on, 8/8 ranks init done``"""
    report = host.report
    assert report is not None
    parts = [", ".join(f"{iface} {addr}" for iface, addr in report.interfaces)]
    parts.append(_network(report))
    if report.gdr is not None:
        parts.append(f"GPUDirect RDMA {report.gdr}")
    missing = host.missing
    done = f"{len(host.ranks) - len(missing)}/{len(host.ranks)} ranks init done"
    parts.append(done + (f" (not: {_ranks(missing)})" if missing else ""))
    return f"nccl {host.name}: " + ", ".join(p for p in parts if p)


def cross_host_flags(hosts: Sequence[HostNccl], world_size: int) -> list[str]:
    """What differs between hosts, or from the plan: Socket among IB, node and rank counts."""
    seen = {h.name: h.report for h in hosts if h.report is not None}
    flags = []
    ib = [name for name, r in seen.items() if any(is_ib(n) for n in r.networks)]
    tcp = [name for name, r in seen.items() if "Socket" in r.networks]
    if ib and tcp:
        no_ib = [name for name in tcp if seen[name].no_ib]
        why = (f"NCCL found no IB device on {fold(no_ib)}" if no_ib else
               "see NCCL_IB_DISABLE, NCCL_IB_HCA and the RDMA devices there")
        flags.append(f"{fold(tcp)} use{'s' if len(tcp) == 1 else ''} Socket (TCP) while "
                     f"{fold(ib)} use IB: every collective runs at the speed of the TCP hosts "
                     f"({why}; in a container, /dev/infiniband must be passed in)")
    nodes = len(hosts)
    for count, names in _grouped(seen, lambda r: r.nnodes).items():
        if count != nodes:
            flags.append(f"NCCL counted {count} node(s) on {fold(names)}, the inventory has "
                         f"{nodes}: NCCL tells hosts apart by hostname and boot id (or "
                         "NCCL_HOSTID), and hosts that share them are taken for one")
    for count, names in _grouped(seen, lambda r: r.nranks).items():
        if count != world_size:
            flags.append(f"NCCL's communicator on {fold(names)} has {count} ranks, the run has "
                         f"{world_size}")
    return flags


def _grouped(reports: dict[str, NcclReport],
             value: Callable[[NcclReport], Optional[int]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for name, report in reports.items():
        found = value(report)
        if found is not None:
            out.setdefault(found, []).append(name)
    return out


def init_flags(hosts: Sequence[HostNccl], *, ended: bool,
               waited: Optional[float] = None) -> list[str]:
    """Ranks that have not initialised their communicator, named per host."""
    flags = []
    verb = "never completed" if ended else f"have not completed, after {waited or 0:.0f} s,"
    for host in hosts:
        missing = host.missing
        if host.report is None and ended:
            flags.append(f"no NCCL log from {host.name}: ranks {_ranks(missing)} never "
                         "started NCCL")
        elif missing and host.report is not None:
            flags.append(f"{host.name}: ranks {_ranks(missing)} {verb} NCCL init (a firewall "
                         "between hosts, a wrong interface, or a rank stuck before init)")
    return flags


def summary(hosts: Sequence[HostNccl], world_size: int) -> Optional[dict[str, object]]:
    """For summary.json: each host's report and line, and the flags; None for a run without
    NCCL."""
    if not any(h.report is not None for h in hosts):
        return None
    return {"hosts": {h.name: {**h.report.public(), "line": host_line(h)}
                      for h in hosts if h.report is not None},
            "flags": cross_host_flags(hosts, world_size) + init_flags(hosts, ended=True)}


class NcclWatch:
    """The controller's side during a run: what has been said, and when to say the rest."""

    def __init__(self, ranks: dict[str, range], notify: Callable[[str], None],
                 patience: float = INIT_PATIENCE) -> None:
        self.ranks = ranks  # every host's global ranks, in node order
        self.notify = notify
        self.patience = patience
        self.reports: dict[str, NcclReport] = {}
        self.first_seen: dict[str, float] = {}
        self.shown: set[str] = set()
        self.flagged = False

    @property
    def world_size(self) -> int:
        return sum(len(r) for r in self.ranks.values())

    def hosts(self) -> list[HostNccl]:
        return [HostNccl(name, ranks, self.reports.get(name)) for name, ranks in self.ranks.items()]

    def update(self, name: str, report: NcclReport, now: float) -> None:
        self.reports[name] = report
        self.first_seen.setdefault(name, now)
        host = HostNccl(name, self.ranks[name], report)
        if name not in self.shown and not host.missing:
            self._show(host)
        if not self.flagged and len(self.shown) == len(self.ranks):
            self._flag(cross_host_flags(self.hosts(), self.world_size))

    def tick(self, now: float) -> None:
        """While the run goes on: a host whose ranks take too long is shown as it stands."""
        for name, since in self.first_seen.items():
            if name not in self.shown and timing.over(now, since, self.patience):
                host = HostNccl(name, self.ranks[name], self.reports[name])
                self._show(host)
                for flag in init_flags([host], ended=False, waited=now - since):
                    self.notify(f"nccl warning: {flag}")

    def finish(self) -> None:
        """The run has ended: the hosts not shown yet as they stand, then every flag not given."""
        if not self.reports:
            return
        for host in self.hosts():
            if host.name not in self.shown and host.report is not None:
                self._show(host)
        if not self.flagged:
            hosts = self.hosts()
            self._flag(cross_host_flags(hosts, self.world_size)
                       + init_flags(hosts, ended=True))

    def _show(self, host: HostNccl) -> None:
        self.shown.add(host.name)
        self.notify(host_line(host))

    def _flag(self, flags: list[str]) -> None:
        self.flagged = True
        for flag in flags:
            self.notify(f"nccl warning: {flag}")
