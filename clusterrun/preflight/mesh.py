"""Preflight's last phase: every host to every other host, as NCCL and Gloo will connect them.

Checking each worker against the master proves only the bootstrap: the ranks then connect
every pair on ephemeral ports, and a firewall that admits SSH and the master port passes every
other check and hangs the job at init (NVIDIA/nccl#388, pytorch/gloo#54). So every host listens
on an ephemeral port of its chosen address, every host connects to all the others at once, and
every host looks up the others' names and master_addr, so a name that resolves to another
address on some host is caught too. One round trip per host (connect and resolve sent together,
run together there), every host at once: a host that drops SYNs costs one connect timeout in
all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import Inventory
from clusterrun.inventory.ranges import fold
from clusterrun.preflight import names as naming
from clusterrun.preflight.answers import Connected, Listening, connections
from clusterrun.preflight.net_facts import Lookup, lookups
from clusterrun.preflight.probe_session import ProbeSession
from clusterrun.preflight.report import Blocked, HostReport, Pairs
from clusterrun.remote.shared import linkrule
from clusterrun.remote.shared.protocol import Probe
from clusterrun.transport import parallel

PAIR_SECONDS = 5.0
RESOLVE_SECONDS = 5.0


def run(inv: Inventory, reports: Sequence[HostReport],
        sessions: dict[str, ProbeSession]) -> Optional[Pairs]:
    members = [r for r in reports if r.outcome is None and r.address and r.spec.name in sessions]
    ports = _listen(members, sessions)
    listening = [r for r in members if r.spec.name in ports]
    wanted = naming.names_to_resolve(inv, listening)
    # host -> its connections to the others, and what it resolved the names to.
    answers: dict[str, tuple[Mapping[str, Connected], Mapping[str, Lookup]]] = {}

    def one(report: HostReport) -> None:
        targets = [[o.spec.name, o.address, ports[o.spec.name]] for o in listening
                   if o is not report]
        asked: dict[str, tuple[str, Mapping[str, object]]] = {}
        if targets:
            asked["connect"] = (Probe.MESH_CONNECT, {"targets": targets, "src": report.address,
                                                 "timeout": PAIR_SECONDS})
        if wanted:
            asked["resolve"] = (Probe.RESOLVE, {"names": wanted, "timeout": RESOLVE_SECONDS})
        # Both at once: the probe connects while it resolves.
        replies = dict(zip(asked, sessions[report.spec.name].ask_all(list(asked.values()))))
        answers[report.spec.name] = (connections(replies.get("connect")),
                                     lookups(replies.get("resolve")))

    # Every host at once: its session is open and each request is one message on it, so a
    # fan-out cap would only make the last hosts wait for the first ones' connect timeouts.
    results = parallel.run(one, listening, PAIR_SECONDS + RESOLVE_SECONDS + 10,
                           fanout=len(listening), name=lambda r: r.spec.name)
    for result in results.failed:
        assert result.failure is not None
        result.item.probe_failed(result.failure.outcome, result.failure.message)
    answered = [r for r in listening if r.spec.name in answers and r.outcome is None]
    naming.judge(inv, answered, {n: resolved for n, (_pairs, resolved) in answers.items()})
    if len(answered) < 2:
        return None
    pairs = Pairs([r.spec.name for r in answered], [], {})
    for r in answered:
        found = r.known.port_range
        pairs.port_ranges[r.spec.name] = list(found) if found else None
        for target, connected in answers[r.spec.name][0].items():
            if not connected.ok and target in pairs.hosts:
                pairs.blocked.append(Blocked(r.spec.name, target, str(connected.error)))
    _judge_pairs(answered, pairs)
    _judge_port_ranges(answered)
    return pairs


def _listen(members: Sequence[HostReport], sessions: dict[str, ProbeSession]) -> dict[str, int]:
    ports: dict[str, int] = {}

    def one(report: HostReport) -> None:
        reply = Listening.from_json(sessions[report.spec.name].ask(Probe.MESH_LISTEN,
                                                                   addr=report.address))
        if reply.ok and reply.port is not None:
            ports[report.spec.name] = reply.port
        else:
            report.add("pairs", False, f"{report.spec.name}: cannot listen on an ephemeral port "
                       f"of {report.address}: {reply.error}.")

    results = parallel.run(one, members, 15.0, fanout=len(members), name=lambda r: r.spec.name)
    for result in results.failed:
        assert result.failure is not None
        result.item.fail(Outcome.PROBE_FAILED, "probe", result.failure.message)
    return ports


def blamed(pairs: Pairs) -> dict[str, list[Blocked]]:
    """Which host each failed pair is put on: a host nobody reaches (its firewall) or a host
    that reaches nobody (its egress); otherwise the one connected to (remote/shared/linkrule.py, the
    stall watchdog's rule too)."""
    found = linkrule.blamed(pairs.hosts, pairs.blocked)
    return {host: list(mine) for host, mine in found.items()}


def fix(port_range: Optional[Sequence[int]]) -> str:
    span = f"{port_range[0]}-{port_range[1]}" if port_range else "net.ipv4.ip_local_port_range"
    return (f"NCCL and Gloo connect every pair of ranks on ephemeral ports ({span}), not only "
            "the master port. Open that range between the hosts in their firewalls, or narrow "
            "it on every host (sysctl -w net.ipv4.ip_local_port_range='50000 51000') and open "
            "that.")


def _judge_pairs(answered: Sequence[HostReport], pairs: Pairs) -> None:
    blame = blamed(pairs)
    for r in answered:
        name = r.spec.name
        mine = blame.get(name, [])
        if not mine:
            r.add("pairs", True, f"reached all {len(pairs.hosts) - 1} other hosts on ephemeral "
                  "ports, and reached from them")
            continue
        said = linkrule.failed_pairs(name, r.address, mine, fold)
        r.add("pairs", False, f"{said}. {fix(r.known.port_range)}")


def _judge_port_ranges(answered: Sequence[HostReport]) -> None:
    ref = answered[0]
    want = ref.known.port_range
    for r in answered:
        if not r.known.port_range:
            other = "the other hosts'" if r is ref else f"{ref.spec.name}'s"
            r.add("port_range", True, "warning: net.ipv4.ip_local_port_range is unknown on "
                  f"{r.spec.name}: the probe did not report it, so it was not compared with "
                  f"{other} (`sysctl net.ipv4.ip_local_port_range` there says).")
            r.checks[-1].group = ("warning: net.ipv4.ip_local_port_range unknown: the probe did "
                                  "not report it, so it was not compared")
    for r in answered[1:]:
        have = r.known.port_range
        if have and want and have != want:
            text = (f"net.ipv4.ip_local_port_range is {have[0]}-{have[1]}, but {want[0]}-"
                    f"{want[1]} on {ref.spec.name}: a firewall rule written for one range "
                    "leaves the other's ports closed. Set the same range on every host.")
            r.add("port_range", True, f"warning: {text}")
            r.checks[-1].group = (f"warning: net.ipv4.ip_local_port_range {have[0]}-{have[1]}, "
                                  f"{want[0]}-{want[1]} on {ref.spec.name}; set the same range "
                                  "on every host")
