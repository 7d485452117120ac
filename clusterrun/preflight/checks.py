"""Preflight: one probe per host, in parallel, and the verdict per host.

Each host's thread connects, starts the probe and reads the host's facts. The master's thread
then settles master_addr and opens a short-lived listener on master_port; every worker's thread
picks its interface (the device routing to master_addr) and opens a TCP connection to the
master from that interface's address. SSH reachability alone proves nothing about that path.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Optional

from clusterrun.inventory import AUTO, HostSpec, Inventory
from clusterrun.plan import ranks
from clusterrun.preflight.probe_session import ProbeSession, first_ipv4
from clusterrun.preflight.report import Check, CheckReport, HostReport
from clusterrun.transport import ConnectError, SshOptions, Transport, connect, parallel
from clusterrun.transport.programs import ProgramError

SLOW_DNS_SECONDS = 2.0
PROBE_SECONDS = 20.0


class _Rendezvous:
    """What the workers' threads need from the master's thread."""

    def __init__(self, workers: int) -> None:
        self.master_ready = threading.Event()
        self.addr: Optional[str] = None
        self.port: Optional[int] = None
        self.listening = False
        self.problem = "the master could not be probed"
        self._left = workers
        self._lock = threading.Lock()
        self.workers_done = threading.Event()
        if workers == 0:
            self.workers_done.set()

    def worker_done(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self.workers_done.set()


def run(inv: Inventory, options: SshOptions, *, data_path: bool = True,
        keep_connections: bool = False) -> CheckReport:
    """Probe every host; never raises for a host's failure (it is in the report)."""
    ordered = ranks.in_rank_order(inv.hosts)
    reports = {h.name: HostReport(h, rank) for rank, h in enumerate(ordered)}
    rdv = _Rendezvous(len(ordered) - 1)
    transports: dict[str, Transport] = {}
    lock = threading.Lock()
    deadline = options.connect_timeout + PROBE_SECONDS * 2

    def one(spec: HostSpec) -> None:
        report = reports[spec.name]
        session: Optional[ProbeSession] = None
        try:
            transport = connect(spec, options)
            with lock:
                transports[spec.name] = transport
            session = ProbeSession(transport, spec, PROBE_SECONDS)
            report.facts = session.facts
            report.add("ssh", True, _ssh_detail(spec, transport, report.facts))
            _local_checks(report)
            if spec.master:
                _master(inv, report, session, rdv, data_path=data_path, transports=transports)
            else:
                _worker(report, session, rdv, data_path, options.connect_timeout)
        except (ConnectError, ProgramError) as exc:
            report.failure_kind = exc.kind
            report.add("ssh" if isinstance(exc, ConnectError) else "probe", False, exc.message)
        finally:
            if spec.master:
                rdv.master_ready.set()  # also when it failed: workers must not wait for it
            else:
                rdv.worker_done()
            if session is not None:
                session.close()

    results = parallel.run(one, ordered, deadline)
    for result in results:
        if result.failure is not None:
            report = reports[result.spec.name]
            report.failure_kind = result.failure.kind
            report.add("ssh", False, result.failure.message)
    _compare_versions(list(reports.values()))
    report = CheckReport(list(reports.values()), rdv.addr, rdv.port, transports)
    if not keep_connections:
        report.close()
        report.transports = {}
    return report


def _ssh_detail(spec: HostSpec, transport: Transport, facts: dict[str, Any]) -> str:
    where = ("this machine (local, no SSH)" if spec.local
             else f"connected to {getattr(transport, 'address', spec.host)}")
    return f"{where}, hostname {facts.get('hostname')}"


def _local_checks(report: HostReport) -> None:
    facts = report.facts
    name = report.spec.name
    report.add("python", True, f"{facts['python']} ({facts['python_path']})")
    torch = facts.get("torch")
    if torch and torch.get("version"):
        report.add("torch", True, f"{torch['version']}")
    else:
        report.add("torch", False, f"torch is not installed for {facts['python_path']} on "
                   f"{name}: install it there (pip install torch) or point `python:`/`setup:` "
                   "at the environment that has it.")
    workdir = facts.get("workdir") or {}
    if workdir.get("ok"):
        report.add("workdir", True, workdir["path"])
    else:
        report.add("workdir", False, f"cannot use workdir {workdir.get('path')} on {name}: "
                   f"{workdir.get('error')}. Set `workdir:` to a writable directory.")
    dns = facts.get("dns") or {}
    seconds = dns.get("seconds")
    if dns.get("error") or seconds is None or seconds > SLOW_DNS_SECONDS:
        why = f"failed ({dns['error']})" if dns.get("error") else f"took {seconds} s"
        report.add("dns", True, f"warning: looking up its own name {dns.get('hostname')!r} "
                   f"{why}; torch does this at start-up, which will be slow. List the hostname "
                   "in /etc/hosts on every host.")
    else:
        report.add("dns", True, f"{dns.get('hostname')} -> {', '.join(dns.get('addresses', []))}")
    gpus = report.spec.gpus
    if gpus is not None and (facts["gpus"] == 0 or max(gpus) >= facts["gpus"]):
        report.add("gpus", True, f"warning: `gpus: {list(gpus)}` but nvidia-smi lists "
                   f"{facts['gpus']} GPU(s) on {name}.")
    else:
        report.add("gpus", True, f"{report.gpus} visible")


def _master_addr(inv: Inventory, report: HostReport, session: ProbeSession,
                 transports: dict[str, Transport]) -> str:
    if inv.master_addr != AUTO:
        return inv.master_addr
    if all(h.local for h in inv.hosts):
        return "127.0.0.1"
    facts = report.facts
    if report.spec.interface != AUTO:
        # The master's own address on its data interface (the one the inventory names). If
        # that interface is unusable, _pick_interface says so; fall back to the SSH address.
        own = next((i for i in facts.get("interfaces", []) if i["name"] == report.spec.interface),
                   None)
        if own is not None and own.get("up") and first_ipv4(own):
            return str(first_ipv4(own))
    server = facts.get("ssh_server_address")
    if server and session.ask("route", addr=server).get("local"):
        return server  # the address the controller reached the master on
    for spec in inv.hosts:  # a local master: the address facing the first remote host
        if not spec.local:
            try:
                peer = socket.gethostbyname(
                    getattr(transports.get(spec.name), "address", spec.host))
            except OSError:
                continue  # an ~/.ssh/config alias this machine cannot resolve: try the next
            src = session.ask("route", addr=peer).get("src")
            if src:
                return src
    raise ProgramError("error", f"{report.spec.name}: cannot tell which address the workers should "
                     "use to reach the master; set `master_addr:` in the inventory.")


def _master(inv: Inventory, report: HostReport, session: ProbeSession, rdv: _Rendezvous, *,
            data_path: bool, transports: dict[str, Transport]) -> None:
    try:
        rdv.addr = _master_addr(inv, report, session, transports)
    except ProgramError as exc:
        rdv.problem = exc.message
        report.add("master_addr", False, exc.message)
        return
    _pick_interface(report, session, rdv.addr)
    listen = session.ask("listen", addr=rdv.addr, port=inv.master_port or 0)
    rdv.port = listen.get("port")
    if listen.get("ok"):
        rdv.listening = data_path
        report.add("master_port", True, f"{rdv.port} is free on {report.spec.name}")
    else:
        rdv.problem = f"master_port {rdv.port} is not usable on the master"
        report.add("master_port", False, f"port {rdv.port} on {report.spec.name}: "
                   f"{listen.get('error')}. Another job may hold it; pick another `master_port:` "
                   "or use `auto`.")
    rdv.master_ready.set()
    if rdv.listening:
        rdv.workers_done.wait(PROBE_SECONDS * 2)


def _worker(report: HostReport, session: ProbeSession, rdv: _Rendezvous, data_path: bool,
            timeout: float) -> None:
    if not rdv.master_ready.wait(timeout + PROBE_SECONDS) or rdv.addr is None:
        report.add("interface", False, f"not chosen: {rdv.problem}.")
        return
    _pick_interface(report, session, rdv.addr)
    if not data_path:
        return
    if not rdv.listening or rdv.port is None:
        report.add("data_path", False, f"not tested: {rdv.problem}.")
        return
    if report.address is None:
        report.add("data_path", False, "not tested: no usable interface.")
        return
    result = session.ask("connect", addr=rdv.addr, port=rdv.port, src=report.address, timeout=5)
    where = f"{rdv.addr}:{rdv.port} from {report.interface} ({report.address})"
    if result.get("ok"):
        report.add("data_path", True, f"connected to {where}")
    else:
        report.add("data_path", False, f"{report.spec.name} cannot open a TCP connection to "
                   f"{where}: {result.get('error')}. A firewall may block the port between the "
                   "hosts, or this interface does not reach the master; set `interface:` or "
                   "`master_addr:`.")


def _describe(ifaces: list[dict[str, Any]]) -> str:
    parts = []
    for item in ifaces:
        addrs = ", ".join(a for a in item.get("addrs", []) if ":" not in a.split("/")[0])
        state = "" if item.get("up") else " DOWN"
        parts.append(f"{item['name']} ({addrs or 'no IPv4'}{state})")
    return "; ".join(parts)


def _pick_interface(report: HostReport, session: ProbeSession, master_addr: str) -> None:
    spec = report.spec
    ifaces = report.facts.get("interfaces", [])
    by_name = {i["name"]: i for i in ifaces}
    loopback = master_addr.startswith("127.") or master_addr == "::1"
    if spec.interface != AUTO:
        iface = by_name.get(spec.interface)
        problem = None
        if iface is None:
            problem = "does not exist there"
        elif not iface.get("up"):
            problem = "is down"
        elif first_ipv4(iface) is None:
            problem = "has no IPv4 address"
        if problem:
            report.add("interface", False, f"interface {spec.interface!r} {problem} on {spec.name}."
                       f" Its interfaces: {_describe(ifaces)}. Set `interface:` to one of them, "
                       "or `auto`.")
            return
        report.interface, report.address = spec.interface, first_ipv4(iface)
        report.add("interface", True, f"{spec.interface} {report.address} (from the inventory)")
        return
    route = session.ask("route", addr=master_addr)
    dev = route.get("dev")
    if not dev or (dev == "lo" and not loopback):
        why = route.get("error") or f"its route to {master_addr} goes through {dev or 'nothing'}"
        report.add("interface", False, f"no interface on {spec.name} reaches master_addr "
                   f"{master_addr}: {why}. Its interfaces: {_describe(ifaces)}. Set `interface:` "
                   "or `master_addr:`.")
        return
    report.interface, report.address = dev, route.get("src")
    role = "holds" if route.get("local") else "routes to"
    report.add("interface", True, f"{dev} {report.address} ({role} {master_addr})")


def _compare_versions(reports: list[HostReport]) -> None:
    """Every host must run the master's Python (major.minor) and torch; else ranks disagree on
    pickled objects and collectives, or crash at start-up."""
    probed = [r for r in reports if r.facts]
    if not probed:
        return
    # The master's versions are the reference; when it could not be probed, the first host's.
    ref = next((r for r in probed if r.spec.master), probed[0])
    where = f"the master {ref.spec.name}" if ref.spec.master else ref.spec.name
    for r in probed:
        if r is ref:
            continue
        py, ref_py = _minor(r.python), _minor(ref.python)
        if py != ref_py:
            _fail(r, "python", f"Python {r.python} on {r.spec.name} but {ref.python} on "
                  f"{where}: use the same Python {ref_py} everywhere.")
        if r.torch and ref.torch and r.torch != ref.torch:
            _fail(r, "torch", f"torch {r.torch} on {r.spec.name} but {ref.torch} on {where}: "
                  "install the same version everywhere.")


def _minor(version: Optional[str]) -> str:
    return ".".join((version or "").split(".")[:2])


def _fail(report: HostReport, name: str, detail: str) -> None:
    for i, check in enumerate(report.checks):
        if check.name == name:
            report.checks[i] = Check(name, False, detail)
            return
    report.add(name, False, detail)
