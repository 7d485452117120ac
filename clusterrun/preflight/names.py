"""Host names: what each host's own name resolves to there and on the other hosts, and whether
every host resolves a master_addr given as a name to the same address.

clusterrun hands torch addresses and interface names, so a bad name seldom breaks its own
launch; but code that advertises `socket.getfqdn()` to its peers (Gloo without an interface,
other launchers, data loaders, logging) hands them whatever the name resolves to. A name that
resolves to 127.0.1.1 (Debian's /etc/hosts default) or only to IPv6 is the classic case
(pytorch/gloo#223, pytorch/pytorch#131691): warnings. A master_addr that resolves differently
on two hosts sends their ranks to different stores: a failure.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Optional

from clusterrun.inventory import AUTO, HostSpec, Inventory
from clusterrun.inventory.ranges import fold
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.net_facts import Lookup
from clusterrun.preflight.report import Check, HostReport, warn

# host -> name -> what that host resolved the name to (the probe's `resolve` answers).
Answers = Mapping[str, Mapping[str, Lookup]]


def is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


def own_names(facts: HostFacts) -> list[str]:
    """The host's name and fully qualified name (once each; `localhost` says nothing)."""
    out: list[str] = []
    for name in (facts.names.hostname, facts.names.fqdn):
        if name and name not in out and not name.startswith("localhost"):
            out.append(name)
    return out


def local_check(spec: HostSpec, facts: HostFacts) -> Optional[Check]:
    """A warning when the host's own names resolve to loopback or only to IPv6 there, or
    when the probe did not say what they resolve to."""
    resolved = facts.names.resolved
    if resolved is None:
        return warn("names", f"what {spec.name}'s own names resolve to there is unknown: the "
                    "probe did not report it, so loopback and IPv6-only names, and what the "
                    "other hosts make of them, were not checked (`getent hosts $(hostname)` "
                    "there says).", "what its own names resolve to is unknown: the probe did "
                    "not report it, so they were not checked")
    for name in own_names(facts):
        addrs = list(resolved.get(name, Lookup()).addresses)
        loop = [a for a in addrs if is_loopback(a)]
        if loop:
            return warn("names", f"{spec.name}'s own name {name!r} resolves to {loop[0]} there. "
                        "clusterrun gives torch the interface and addresses, but code that "
                        "advertises the host name to its peers hands them a loopback address. "
                        f"Map {name} to the host's address in /etc/hosts (or DNS).",
                        f"its own name resolves to loopback ({loop[0]}); map it to the host's "
                        "address in /etc/hosts")
        if addrs and all(":" in a for a in addrs):
            return warn("names", f"{spec.name}'s own name {name!r} resolves only to IPv6 "
                        f"({', '.join(addrs)}) there; code that looks it up for an IPv4 address "
                        f"fails. Add its IPv4 address for {name} to /etc/hosts (or DNS).",
                        "its own name resolves only to IPv6; add its IPv4 address to /etc/hosts")
    return None  # the `dns` check already shows what the name resolves to


def names_to_resolve(inv: Inventory, reports: Sequence[HostReport]) -> list[str]:
    wanted: list[str] = []
    for r in reports:
        for name in own_names(r.known):
            if name not in wanted:
                wanted.append(name)
    master = master_name(inv)
    if master and master not in wanted:
        wanted.append(master)
    return wanted


def master_name(inv: Inventory) -> Optional[str]:
    """master_addr when the inventory gives it as a name (each host must resolve it alike)."""
    if inv.master_addr == AUTO or _is_ip(inv.master_addr):
        return None
    return inv.master_addr


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def judge(inv: Inventory, reports: Sequence[HostReport],
          answers: Answers) -> None:
    """``answers``: host -> name -> Lookup, as each host resolved the others' names (and
    master_addr)."""
    for r in reports:
        _seen_by_others(r, reports, answers)
    master = master_name(inv)
    if master:
        _master_everywhere(master, reports, answers)


def _seen_by_others(report: HostReport, reports: Sequence[HostReport],
                    answers: Answers) -> None:
    wrong: dict[tuple[str, str], list[str]] = {}
    for name in own_names(report.known):
        for other in reports:
            if other is report:
                continue
            addrs = list(answers.get(other.spec.name, {}).get(name, Lookup()).addresses)
            # A name the others cannot resolve is fine: clusterrun hands out addresses.
            if addrs and report.address not in addrs:
                wrong.setdefault((name, ", ".join(addrs)), []).append(other.spec.name)
    if not wrong:
        return
    (name, found), where = next(iter(wrong.items()))
    report.add("names", True, f"warning: {report.spec.name}'s name {name!r} resolves on "
               f"{fold(where)} to {found}, not to {report.address}, the address "
               "clusterrun uses for it: code that connects to peers by host name will reach "
               "another interface, or nothing. Fix /etc/hosts or DNS on those hosts.")


def _master_everywhere(master: str, reports: Sequence[HostReport],
                       answers: Answers) -> None:
    seen: dict[str, Optional[str]] = {}
    for r in reports:
        found = answers.get(r.spec.name, {}).get(master, Lookup())
        seen[r.spec.name] = next((a for a in found.addresses if ":" not in a), None)
    ref = next((r for r in reports if r.spec.master), reports[0] if reports else None)
    if ref is None:
        return
    want = seen.get(ref.spec.name)
    for r in reports:
        have = seen.get(r.spec.name)
        if have == want and have is not None:
            continue
        got = f"to {have}" if have else "to no IPv4 address"
        where = f"to {want} on {ref.spec.name}" if want else f"not on {ref.spec.name} either"
        r.add("master_addr", False, f"master_addr {master!r} resolves {got} on {r.spec.name} "
              f"but {where}: the ranks would look for the master in different places. Give "
              "`master_addr:` as an IP address, or make /etc/hosts or DNS agree on every host.")
