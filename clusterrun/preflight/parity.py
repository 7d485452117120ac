"""What must be the same on every host, compared across them once every host has answered.

Software: torch's CUDA, the NCCL torch will load (nccl#1267: one host on another version hangs
or corrupts collectives) and every installed Python package, named when they differ. Links:
the MTU and speed of each host's chosen interface (nccl#1524: mismatched MTU), and whether each
host has an active RDMA port. The odd host out is named against what the others have, so that
the report folds it: `gpu[03,07]: MTU 9000, others 1500`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Optional, TypeVar

from clusterrun.inventory.ranges import fold
from clusterrun.preflight import limits
from clusterrun.preflight.net_facts import Link
from clusterrun.preflight.report import HostReport

T = TypeVar("T", bound=Hashable)

SLOW_LINK_MBIT = 10_000
MAX_LISTED = 8


def compare(reports: Sequence[HostReport]) -> None:
    probed = [r for r in reports if r.facts and r.outcome is None]
    for r in probed:
        _link_unknown(r)
    if len(probed) < 2:
        for r in probed:
            _speed(r, None)
        return
    ref = next((r for r in probed if r.spec.master), probed[0])
    others = [r for r in probed if r is not ref]
    _software(ref, others)
    _packages(ref, others)
    _links(probed)


def _unknown(r: HostReport, name: str, what: str, ref: Optional[HostReport] = None) -> None:
    """A warning that ``what`` ("torch's CUDA is") is unknown on ``r`` and was not compared:
    the probe did not say (``ref``: the host it was to be compared with; None: every other)."""
    other = f"{ref.spec.name}'s" if ref is not None else "the other hosts'"
    r.add(name, True, f"warning: {what} unknown on {r.spec.name}: the probe did not say, so "
          f"this was not compared with {other}.", f"warning: {what} unknown: the probe did "
          "not say, so this was not compared with the other hosts'")


def _software(ref: HostReport, others: Sequence[HostReport]) -> None:
    for what in ("cuda", "nccl"):
        label = "torch's CUDA" if what == "cuda" else "the NCCL torch loads"
        if not _known(ref, what):
            _unknown(ref, what, f"{label} is")
            continue
        want = _version(ref, what)
        for r in others:
            if not _known(r, what):
                _unknown(r, what, f"{label} is", ref)
                continue
            have = _version(r, what)
            if have == want:
                continue
            r.add(what, False, f"{label} is {have or 'none'} on {r.spec.name} but "
                  f"{want or 'none'} on {ref.spec.name}: collectives between them fail or "
                  "hang. Install the same torch build (and nvidia-nccl package) everywhere.",
                  f"{label} {have or 'none'}, {want or 'none'} on {ref.spec.name}; install "
                  "the same build everywhere")


def _known(r: HostReport, what: str) -> bool:
    """Whether the probe said (None is an answer: a CPU build has no CUDA and no NCCL; so is
    a host without torch, whose CUDA counts as none)."""
    if what == "cuda":
        torch = r.known.torch
        return torch is None or torch.says_cuda
    return r.known.says_nccl


def _version(r: HostReport, what: str) -> Optional[str]:
    if what == "cuda":
        torch = r.known.torch
        return torch.cuda if torch is not None else None
    return r.known.nccl


def package_diff(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """`numpy 2.0.1 (1.26.4 there)`, `accelerate missing (0.30.1 there)`, ..."""
    out = []
    for name in sorted(set(mine) | set(theirs)):
        have, want = mine.get(name), theirs.get(name)
        if have == want:
            continue
        if have is None:
            out.append(f"{name} missing ({want} there)")
        elif want is None:
            out.append(f"{name} {have} (not installed there)")
        else:
            out.append(f"{name} {have} ({want} there)")
    return out


def _packages(ref: HostReport, others: Sequence[HostReport]) -> None:
    want = ref.known.packages
    if want is None:
        _unknown(ref, "packages", "the installed Python packages are")
        return
    for r in others:
        have = r.known.packages
        if have is None:
            _unknown(r, "packages", "the installed Python packages are", ref)
            continue
        diff = package_diff(have, want)
        if not diff:
            r.add("packages", True, f"the same {len(have)} Python packages as {ref.spec.name}")
            continue
        listed = "; ".join(diff[:MAX_LISTED]).replace(" there)", f" on {ref.spec.name})")
        more = f"; and {len(diff) - MAX_LISTED} more" if len(diff) > MAX_LISTED else ""
        r.add("packages", True, f"warning: Python packages on {r.spec.name} differ from "
              f"{ref.spec.name}'s: {listed}{more}. Ranks that import different versions may "
              "disagree; install the same set everywhere (pip freeze on one host, pip install "
              "-r on the others).", f"warning: Python packages differ from {ref.spec.name}'s: "
              f"{listed}{more}")


def _majority(values: list[T]) -> Optional[T]:
    return Counter(values).most_common(1)[0][0] if values else None


def _chosen(r: HostReport) -> Optional[Link]:
    """The MTU and speed of the host's chosen interface; None: unknown (or none chosen)."""
    return r.known.links.get(r.interface or "")


def _link_unknown(r: HostReport) -> None:
    if r.interface and not _chosen(r):
        _unknown(r, "mtu", f"the MTU and speed of {r.interface} are")


def _links(probed: Sequence[HostReport]) -> None:
    chosen = [(r, link) for r in probed if r.interface and (link := _chosen(r)) is not None]
    usual_mtu = _majority([link.mtu for _r, link in chosen])
    speeds = [link.speed for _r, link in chosen if link.speed]
    usual_speed = _majority(speeds)
    for r, link in chosen:
        mtu = link.mtu
        if mtu != usual_mtu:
            r.add("mtu", True, f"warning: MTU {mtu} on {r.interface} of {r.spec.name}, but "
                  f"{usual_mtu} on the others' interfaces: frames larger than the smaller MTU "
                  "are dropped, and NCCL hangs on them (over RoCE/IB in particular). Set the "
                  "same MTU on every host and on the switch (ip link set IF mtu N).",
                  f"warning: MTU {mtu}, others {usual_mtu}; set the same MTU everywhere")
        _speed(r, usual_speed)
    _rdma_everywhere(probed)


def _speed(r: HostReport, usual: Optional[int]) -> None:
    link = _chosen(r)
    speed = link.speed if link is not None else None
    if not speed:
        return
    if speed < SLOW_LINK_MBIT:
        r.add("link", True, f"warning: {r.interface} on {r.spec.name} is a {speed} Mbit/s "
              "link: multi-node training over it is often slower than on one node. Use a "
              "faster interface (`interface:`), or check the cable and switch port.",
              f"warning: {speed} Mbit/s link; multi-node training over it is often slower than "
              "one node")
    elif usual and speed != usual:
        r.add("link", True, f"warning: {r.interface} on {r.spec.name} runs at {speed} Mbit/s, "
              f"the others at {usual}: the slowest link sets the pace of every collective.",
              f"warning: link at {speed} Mbit/s, others {usual}")


def _rdma_everywhere(probed: Sequence[HostReport]) -> None:
    known = {r.spec.name: r.known for r in probed}
    with_ib = [r for r in probed if limits.active_ports(known[r.spec.name])]
    # A host whose RDMA devices are unknown is neither (limits.py says so on its own line).
    without = [r for r in probed
               if r not in with_ib and known[r.spec.name].infiniband is not None]
    if with_ib and without and len(with_ib) >= len(without):
        holders = fold([r.spec.name for r in with_ib])
        for r in without:
            r.add("infiniband", True, f"warning: {r.spec.name} has no active RDMA port while "
                  f"{holders} have: NCCL then uses TCP sockets between all hosts, and the "
                  "slowest link sets the pace. Check its HCA, cables and subnet manager "
                  "(ibstat), or leave it out.", "warning: no active RDMA port while the other "
                  "hosts have one; NCCL falls back to TCP sockets for the whole job")
    elif with_ib and without:
        lacking = fold([r.spec.name for r in without])
        for r in with_ib:
            r.add("infiniband", True, f"warning: {r.spec.name} has an active RDMA port but "
                  f"{lacking} have none: NCCL uses TCP sockets between all hosts.",
                  "warning: an active RDMA port, while most hosts have none; NCCL uses TCP "
                  "sockets between all hosts")
    rates = [limits.port_info(known[r.spec.name],
                              limits.active_ports(known[r.spec.name])[0]).rate for r in with_ib]
    usual = _majority(rates)
    for r, rate in zip(with_ib, rates):
        if rate != usual:
            r.add("infiniband_rate", True, f"warning: the RDMA port of {r.spec.name} runs at "
                  f"{rate}, the others' at {usual}: the slowest link sets the pace.",
                  f"warning: RDMA rate {rate}, others {usual}")

