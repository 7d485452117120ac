"""What preflight decides from the facts the hosts reported: each host's own checks, the master's
address, each host's interface, and software parity. Pure functions: no network, unit-tested."""

from __future__ import annotations

from typing import Optional

from clusterrun.inventory import AUTO, HostSpec, Inventory
from clusterrun.preflight import hostpaths
from clusterrun.preflight.facts import HostFacts, Workdir
from clusterrun.preflight.net_facts import Interface, Route
from clusterrun.preflight.report import Check, HostReport, warn
from clusterrun.remote.shared import diskfloor

SLOW_DNS_SECONDS = 2.0
LOW_DISK = 1024 ** 3  # below this free in the workdir, a warning


def first_ipv4(iface: Optional[Interface]) -> Optional[str]:
    return iface.ipv4 if iface is not None else None


def owner_of(addr: str, facts: HostFacts) -> Optional[str]:
    """The interface that holds ``addr`` on this host, if any."""
    return next((iface.name for iface in facts.interfaces if iface.holds(addr)), None)


def _workdir_space(name: str, workdir: Workdir) -> Check:
    """A workdir that can be written, and whether a run has room there: below diskfloor.FLOOR free
    the supervisor would stop the run at once (remote/shared/diskfloor.py)."""
    free, path = workdir.free, workdir.path
    where = workdir.free_at or path
    if free is None:
        return warn("workdir", f"{path} on {name} was created and written, but its free space "
                    f"is unknown (the probe could not read it at {where}), so it was not "
                    f"checked against the {diskfloor.FLOOR / 2 ** 20:.0f} MiB a run needs "
                    "(docs/reliability.md). `df` there says.", "the workdir was created and "
                    "written, but its free space is unknown, so it was not checked")
    room = f"{free / 2 ** 20:.1f} MiB" if free < 2 ** 30 else f"{free / 2 ** 30:.1f} GiB"
    if free < diskfloor.FLOOR:
        return Check("workdir", False, f"{where} on {name} has only {room} free: a run "
                     f"stops below {diskfloor.FLOOR / 2 ** 20:.0f} MiB (docs/reliability.md). Free "
                     "space there, or set `workdir:` to a larger disk.")
    if free < LOW_DISK:
        return Check("workdir", True, f"warning: {where} on {name} has only {room} "
                     "free; the ranks' logs go there, and a run is stopped when it is nearly "
                     "full (docs/reliability.md)")
    return Check("workdir", True, f"{path} (created and written, {room} free)")


def host_checks(spec: HostSpec, facts: HostFacts, *, torch_needed: bool = True) -> list[Check]:
    """What one host's facts say on their own: Python, torch, workdir, name lookup (GPUs:
    clusterrun/preflight/gpus.py). ``torch_needed``: False for `launch --no-torchrun`, which
    starts the script itself: a host without torch passes."""
    name = spec.name
    if facts.python and facts.python_path:
        checks = [Check("python", True, f"{facts.python} ({facts.python_path})")]
    else:
        checks = [warn("python", f"the Python version or path on {name} is unknown: the probe "
                       "did not report it, so it was not compared with the master's.",
                       "Python version or path unknown: the probe did not report it, so it "
                       "was not compared")]
    torch = facts.torch
    if torch and torch.version:
        checks.append(Check("torch", True, f"{torch.version}"))
    elif not torch_needed:
        checks.append(Check("torch", True, "not installed (not needed: --no-torchrun starts "
                            "the script without torchrun)"))
    else:
        checks.append(Check("torch", False, no_torch(spec, facts)))
    workdir = facts.workdir
    if "workdir" in facts.unsent:
        checks.append(warn("workdir", f"whether the workdir on {name} can be written is "
                           "unknown: the probe did not report it, so it was not checked.",
                           "workdir unknown: the probe did not report it, so it was not "
                           "checked"))
    elif workdir.ok:
        checks.append(_workdir_space(name, workdir))
    else:
        checks.append(Check("workdir", False, hostpaths.explain(name, workdir.found,
                                                               local=spec.local)))
    dns = facts.dns
    seconds = dns.seconds
    if "dns" in facts.unsent or (seconds is None and not dns.error):
        checks.append(warn("dns", f"how long {name} takes to look up its own name is unknown: "
                           "the probe did not report it, so it was not checked (torch looks "
                           "it up at start-up; `getent hosts $(hostname)` there says).",
                           "own name lookup unknown: the probe did not report it, so it was "
                           "not checked"))
    elif dns.error or seconds is None or seconds > SLOW_DNS_SECONDS:
        why = f"failed ({dns.error})" if dns.error else f"took {seconds} s"
        checks.append(Check("dns", True, f"warning: looking up its own name "
                            f"{dns.hostname!r} {why}; torch does this at start-up, which "
                            "will be slow. List the hostname in /etc/hosts on every host."))
    else:
        checks.append(Check("dns", True, f"{dns.hostname} -> {', '.join(dns.addresses)}"))
    quiet = unreported(name, facts)
    return checks if quiet is None else [*checks, quiet]


def no_torch(spec: HostSpec, facts: HostFacts) -> str:
    """What fixes a host without torch: with `environment:`, the lock or the host's own
    `python:` it is built on (installing into the environment would be drift)."""
    missing = f"torch is not installed for {facts.python_path} on {spec.name}"
    env = spec.environment
    if env is None:
        return (f"{missing}: install it there (pip install torch) or point `python:`/`setup:` "
                "at the environment that has it.")
    if env.system_site_packages:
        return (f"{missing}, the environment of the lock {env.lock}, nor for the host's own "
                "`python:` that it keeps (`system_site_packages: true`): add torch to the "
                "lock, or point `python:` at an interpreter that has torch (a venv or conda "
                "environment holding it), then run `clusterrun env INVENTORY`.")
    return (f"{missing}, the environment of the lock {env.lock}: add torch to the lock, or, "
            "where the host's own `python:` has torch, set `system_site_packages: true` in "
            "`environment:` to keep that one; then run `clusterrun env INVENTORY`.")


# Facts no check of their own speaks for when they are missing: what each one tells.
_QUIET = {"hostname": "its hostname", "user": "the user it runs as",
          "gpus": "how many GPUs it has (the ranks per host)",
          "env": "the NCCL/Gloo variables of its own environment",
          "rsync": "whether rsync is there (the payload is then streamed instead)"}


def unreported(name: str, facts: HostFacts) -> Optional[Check]:
    """One warning naming the facts above that the probe left out: unknown, not fine."""
    lacking = [what for key, what in _QUIET.items() if key in facts.unsent]
    if not lacking:
        return None
    return warn("facts", f"{'; '.join(lacking)} unknown on {name}: the probe did not report "
                "it, so that was not checked.", f"{'; '.join(lacking)} unknown: the probe "
                "did not report it, so that was not checked")


def master_addr_from_facts(inv: Inventory, master: HostSpec,
                           facts: HostFacts) -> Optional[str]:
    """The address workers should reach the master on, when the facts alone say it: the
    inventory's, 127.0.0.1 for an all-local inventory, the master's address on its named
    interface, the address the controller reached it on (when the master holds it), or the
    one its name resolves to. None: ask the master which address faces the other hosts."""
    if inv.master_addr != AUTO:
        return inv.master_addr
    if all(h.local for h in inv.hosts):
        return "127.0.0.1"
    if master.interface != AUTO:
        # If that interface is unusable, pick_interface says so; fall back to the SSH address.
        own = next((i for i in facts.interfaces if i.name == master.interface), None)
        if own is not None and own.up and own.ipv4:
            return own.ipv4
    server = facts.ssh_server_address
    if server and owner_of(server, facts):
        return server
    # Reached without SSH (a Slurm job step): the address its own name resolves to, as the
    # scheduler's nodes resolve each other's names, when the master holds it.
    for addr in facts.dns.addresses:
        if not addr.startswith("127.") and ":" not in addr and owner_of(addr, facts):
            return addr
    return None


def describe_interfaces(facts: HostFacts) -> str:
    parts = []
    for item in facts.interfaces:
        addrs = ", ".join(a for a in item.addrs if ":" not in a.split("/")[0])
        state = "" if item.up else " DOWN"
        parts.append(f"{item.name} ({addrs or 'no IPv4'}{state})")
    return "; ".join(parts)


def pick_interface(spec: HostSpec, facts: HostFacts, master_addr: str,
                   route: Optional[Route]) -> tuple[Optional[str], Optional[str], Check]:
    """(interface, its address, the check saying why) for one host. ``route`` is the host's own
    answer for the way to ``master_addr`` (unused when the inventory names the interface).

    On the master the route to its own address is `lo`: the answer there is the device that
    holds the address. A decoy (virbr0, docker0, a NIC on another subnet) never routes to the
    master, so it is never chosen."""
    by_name = {i.name: i for i in facts.interfaces}
    if spec.interface != AUTO:
        iface = by_name.get(spec.interface)
        problem = None
        if iface is None:
            problem = "does not exist there"
        elif not iface.up:
            problem = "is down"
        elif first_ipv4(iface) is None:
            problem = "has no IPv4 address"
        if problem:
            return None, None, Check("interface", False, f"interface {spec.interface!r} {problem} "
                                     f"on {spec.name}. Its interfaces: "
                                     f"{describe_interfaces(facts)}. Set `interface:` to one of "
                                     "them, or `auto`.")
        address = first_ipv4(iface)
        return spec.interface, address, Check("interface", True, f"{spec.interface} {address} "
                                              "(from the inventory)")
    route = route or Route()
    dev = route.dev
    loopback = master_addr.startswith("127.") or master_addr == "::1"
    if not dev or (dev == "lo" and not loopback):
        why = route.error or f"its route to {master_addr} goes through {dev or 'nothing'}"
        return None, None, Check("interface", False, f"no interface on {spec.name} reaches "
                                 f"master_addr {master_addr}: {why}. Its interfaces: "
                                 f"{describe_interfaces(facts)}. Set `interface:` or "
                                 "`master_addr:`.")
    role = "holds" if route.local else "routes to"
    if not facts.interfaces:  # the route alone chose it: whether it is a decoy is unknown
        return dev, route.src, warn("interface", f"{dev} {route.src} ({role} {master_addr}), "
                                    f"but the interfaces of {spec.name} are unknown: the probe "
                                    "did not report them, so the choice was not checked. "
                                    "`ip -br addr` there says.", f"{dev} {route.src}; its "
                                    "interfaces unknown: the probe did not report them, so "
                                    "the choice was not checked")
    return dev, route.src, Check("interface", True, f"{dev} {route.src} "
                                             f"({role} {master_addr})")


def compare_versions(reports: list[HostReport]) -> None:
    """Every host must run the master's Python (major.minor) and torch; else ranks disagree on
    pickled objects and collectives, or crash at start-up. Mismatches become failed checks."""
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
        if r.python and ref.python and py != ref_py:  # unknown: its own check says so
            r.replace(Check("python", False, f"Python {r.python} on {r.spec.name} but "
                            f"{ref.python} on {where}: use the same Python {ref_py} everywhere."))
        if r.torch and ref.torch and r.torch != ref.torch:
            r.replace(Check("torch", False, f"torch {r.torch} on {r.spec.name} but {ref.torch} "
                            f"on {where}: install the same version everywhere."))


def _minor(version: Optional[str]) -> str:
    return ".".join((version or "").split(".")[:2])
