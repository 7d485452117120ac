"""Preflight in three phases, each in parallel under a deadline, with no host waiting on another:

1. facts: every host is connected to, its probe started, its facts read and judged on their own;
2. the master: its address is settled and its probe opens listeners on master_port and on a
   second port (the detached runs' lifeline);
3. the workers: each picks its interface (the device routing to master_addr) and opens a TCP
   connection to both ports from that interface's address. SSH reachability alone proves nothing
   about that path.

The decisions themselves (master_addr, interfaces, parity) are pure functions in ``decide``.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory import Inventory, ranks
from clusterrun.preflight import container, decide, gpus, limits, mesh, names, parity, stacks, twins
from clusterrun.preflight.answers import Connected, Listening
from clusterrun.preflight.net_facts import Route
from clusterrun.preflight.probe_session import ProbeSession
from clusterrun.preflight.report import CheckReport, HostReport
from clusterrun.remote.shared.protocol import Probe
from clusterrun.transport import parallel
from clusterrun.transport.pool import Connections

PROBE_SECONDS = 20.0
CONNECT_SECONDS = 5.0


@dataclass
class _Master:
    addr: Optional[str] = None
    port: Optional[int] = None
    lifeline_port: Optional[int] = None
    port_free: bool = False
    problem: str = "the master could not be probed"

    @property
    def listening(self) -> bool:
        return self.addr is not None and self.port_free and self.lifeline_port is not None


def run(inv: Inventory, pool: Connections, *, data_path: bool = True, bandwidth: bool = False,
        allow_busy_gpus: bool = False, torch_needed: bool = True,
        on_facts: Optional[Callable[[HostReport], None]] = None,
        after_facts: Optional[Callable[[Sequence[HostReport]], bool]] = None) -> CheckReport:
    """Probe every host; never raises for a host's failure (it is in the report).
    ``bandwidth``: also measure each worker's throughput to the master (`check --bandwidth`);
    ``allow_busy_gpus``: GPU problems are warnings, not failures; ``torch_needed``: False
    where nothing runs torchrun (`launch --no-torchrun`); ``on_facts(report)``: called
    as each host's facts are in, while the others' and the cluster-wide checks go on (launch
    reads the code's manifest there meanwhile); ``after_facts(reports)``: called once every
    host's facts are in, before the cluster-wide checks, says whether preflight goes on: where
    it does not, the report is the facts' alone, ``stopped`` (launch: a host whose
    environment is not the lock's, envs/warm.py)."""
    ordered = ranks.in_rank_order(inv.hosts)
    reports = [HostReport(h, rank) for rank, h in enumerate(ordered)]
    sessions: dict[str, ProbeSession] = {}
    pairs = None
    try:
        _facts(reports, pool, sessions, allow_busy_gpus=allow_busy_gpus,
               torch_needed=torch_needed, on_facts=on_facts)
        if after_facts is not None and not after_facts(reports):
            return CheckReport(reports, None, None, stopped=True)
        twins.judge(reports)
        master = _master(inv, reports[0], sessions.get(ordered[0].name), pool,
                         data_path=data_path)
        _workers(reports[1:], sessions, master, data_path=data_path)
        pairs = mesh.run(inv, reports, sessions) if data_path else None
        if bandwidth and master.addr is not None:
            from clusterrun.preflight import bandwidth as throughput

            throughput.measure(reports, sessions, master.addr)
    finally:
        parallel.run(lambda s: s.close(), list(sessions.values()), 5.0,
                     name=lambda s: s.spec.name)
    _host_limits(inv, reports)
    decide.compare_versions(reports)
    parity.compare(reports)
    gpus.compare_drivers(reports)
    return CheckReport(reports, master.addr, master.port, master.lifeline_port, pairs)


def _host_limits(inv: Inventory, reports: Sequence[HostReport]) -> None:
    """Each host's names and limits, judged against the size of the whole job."""
    per_host = {r.spec.name: r.nproc or 1 for r in reports}
    world = sum(per_host.values())
    alone = all(h.local for h in inv.hosts)  # the demo: loopback is the right answer there
    for r in reports:
        if not r.facts or r.outcome is not None:
            continue
        known = r.known
        found = None if alone else names.local_check(r.spec, known)
        if found is not None:
            r.checks.append(found)
        r.checks.extend(limits.host_checks(r.spec, known, world=world, gpu_ranks=(
            per_host[r.spec.name] if r.gpus else 0)))
        r.checks.extend(stacks.host_checks(r.spec, known))


def _fail_late(report: HostReport, failure: parallel.Failure, pool: Connections) -> None:
    """A host that ran out of time: unreachable only if it never even connected."""
    if failure.outcome is Outcome.COMMAND_TIMEOUT:
        if pool.connected(report.spec.name):
            report.fail(Outcome.PROBE_TIMEOUT, "probe", f"{report.spec.name}: SSH connected "
                        f"but the probe gave no answer within {PROBE_SECONDS:g} s; the host "
                        "may be overloaded, or `setup:` hangs.")
            return
        report.fail(Outcome.CONNECT_TIMEOUT, "ssh", failure.message)
        return
    report.fail(failure.outcome, "probe" if failure.outcome.reached else "ssh", failure.message)


def _facts(reports: Sequence[HostReport], pool: Connections,
           sessions: dict[str, ProbeSession], *, allow_busy_gpus: bool, torch_needed: bool,
           on_facts: Optional[Callable[[HostReport], None]]) -> None:
    def one(report: HostReport) -> None:
        spec = report.spec
        transport = pool.get(spec)
        if spec.container:
            found = container.check(transport, spec, PROBE_SECONDS)
            if found.problem:
                report.fail(Outcome.PROBE_FAILED, "container", found.problem)
                return
            # The engine found here is the one sync, the supervisors, `ps` and `stop` use.
            spec = report.spec = dataclasses.replace(spec, container_engine=found.engine)
        session = ProbeSession(transport, spec, PROBE_SECONDS)
        sessions[spec.name] = session
        report.facts = session.facts
        if spec.container:
            report.facts["container"] = {"name": spec.container, "engine": spec.container_engine,
                                         "user": spec.container_user}
            report.add("container", True, f"{spec.container} ({spec.container_engine}, running; "
                       "everything on this host runs inside it)")
        where = ("this machine (local, no SSH)" if spec.local
                 else f"a step of Slurm job {spec.slurm_job} on {spec.host}"
                 if spec.transport == "srun"
                 else f"connected to {getattr(transport, 'address', spec.host)}")
        known = report.known  # the reply read into typed facts, once for this host's checks
        named = f", hostname {known.hostname}" if known.hostname else ""  # else: decide.unreported
        report.add("ssh", True, f"{where}{named}")
        report.checks.extend(decide.host_checks(spec, known, torch_needed=torch_needed))
        report.checks.extend(gpus.host_checks(spec, known, allow_busy_gpus=allow_busy_gpus))
        if on_facts is not None:
            on_facts(report)

    results = parallel.run(one, reports, pool.options.connect_timeout + PROBE_SECONDS,
                           name=lambda r: r.spec.name)
    for result in results.failed:
        assert result.failure is not None
        _fail_late(result.item, result.failure, pool)


def _master(inv: Inventory, report: HostReport, session: Optional[ProbeSession],
            pool: Connections, *, data_path: bool) -> _Master:
    found = _Master()
    if session is None:
        found.problem = f"the master {report.spec.name} could not be probed"
        return found
    try:
        addr = decide.master_addr_from_facts(inv, report.spec, report.known) or _facing_peers(
            inv, session, pool)
        if addr is None:
            report.add("master_addr", False, f"{report.spec.name}: cannot tell which address the "
                       "workers should use to reach the master; set `master_addr:` in the "
                       "inventory.")
            found.problem = "master_addr is unknown"
            return found
        found.addr = addr
        route = (Route.from_json(session.ask(Probe.ROUTE, addr=addr))
                 if report.spec.interface == "auto" else None)
        report.interface, report.address, check = decide.pick_interface(
            report.spec, report.known, addr, route)
        report.add(check.name, check.ok, check.detail)
        listen = Listening.from_json(session.ask(Probe.LISTEN, addr=addr,
                                                 port=inv.master_port or 0))
        found.port = listen.port
        if not listen.ok:
            report.add("master_port", False, _port_problem(report, listen))
            found.problem = f"master_port {found.port} is not usable on the master"
            return found
        found.port_free = True
        report.add("master_port", True, f"{found.port} is free on {report.spec.name}")
        if data_path:
            lifeline = Listening.from_json(session.ask(Probe.LISTEN, addr=addr, port=0))
            found.lifeline_port = lifeline.port if lifeline.ok else None
            if found.lifeline_port is None:
                report.add("lifeline_port", False, _port_problem(report, lifeline))
                found.problem = "no second port could be opened on the master"
    except ClusterrunError as exc:  # the probe died or went silent mid-conversation
        report.fail(exc.outcome, "probe", exc.message)
        found.problem = f"the master's probe failed: {exc.message}"
    return found


def _port_problem(report: HostReport, listen: Listening) -> str:
    port, name = listen.port, report.spec.name
    if listen.errno == errno.EACCES and port and port < 1024:
        user = report.known.user or "this user"
        return (f"port {port} on {name}: ports below 1024 need root, and clusterrun runs as "
                f"{user} there. Use a `master_port:` of 1024 or more, or `auto`.")
    return (f"port {port} on {name}: {listen.error}. Another job may hold it; pick "
            "another `master_port:` or use `auto`.")


def _facing_peers(inv: Inventory, session: ProbeSession, pool: Connections) -> Optional[str]:
    """A master on this machine: its address facing the first remote host it can resolve."""
    transports = pool.transports
    for spec in inv.hosts:
        if spec.local:
            continue
        try:
            peer = socket.gethostbyname(getattr(transports.get(spec.name), "address", spec.host))
        except OSError:
            continue  # an ~/.ssh/config alias this machine cannot resolve: try the next
        src = Route.from_json(session.ask(Probe.ROUTE, addr=peer)).src
        if src:
            return src
    return None


def _workers(reports: Sequence[HostReport], sessions: dict[str, ProbeSession], master: _Master,
             *, data_path: bool) -> None:
    def one(report: HostReport) -> None:
        session = sessions.get(report.spec.name)
        if session is None:
            return  # failed in phase 1; its report says why
        if master.addr is None:
            report.add("interface", False, f"not chosen: {master.problem}.")
            return
        route = (Route.from_json(session.ask(Probe.ROUTE, addr=master.addr))
                 if report.spec.interface == "auto" else None)
        report.interface, report.address, check = decide.pick_interface(
            report.spec, report.known, master.addr, route)
        report.add(check.name, check.ok, check.detail)
        if data_path:
            _data_path(report, session, master)

    results = parallel.run(one, reports, PROBE_SECONDS + 2 * CONNECT_SECONDS,
                           name=lambda r: r.spec.name)
    for result in results.failed:
        assert result.failure is not None
        result.item.probe_failed(result.failure.outcome, result.failure.message)


def _data_path(report: HostReport, session: ProbeSession, master: _Master) -> None:
    if not master.listening:
        report.add("data_path", False, f"not tested: {master.problem}.")
        return
    if report.address is None:
        report.add("data_path", False, "not tested: no usable interface.")
        return
    assert master.addr is not None
    for port in (master.port, master.lifeline_port):
        result = Connected.from_json(session.ask(Probe.CONNECT, addr=master.addr, port=port,
                                                 src=report.address, timeout=CONNECT_SECONDS))
        where = f"{master.addr}:{port} from {report.interface} ({report.address})"
        if not result.ok:
            report.add("data_path", False, f"{report.spec.name} cannot open a TCP connection to "
                       f"{where}: {result.error}. A firewall may block the port between "
                       "the hosts, or this interface does not reach the master; set "
                       "`interface:` or `master_addr:`.")
            return
    report.add("data_path", True, f"connected to {master.addr}:{master.port} and "
               f":{master.lifeline_port} from {report.interface} ({report.address})")
