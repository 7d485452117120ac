"""Network side of the sandbox (see clusterrun.sandbox): commands, names, subnets, teardown."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import random
import re
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from clusterrun.errors import SandboxError
from clusterrun.sandbox.state import SandboxHost, SandboxNetwork

_T = TypeVar("_T")

# Mount points and the cross-sandbox lock live under /run (tmpfs, root-only, gone on reboot).
RUN_DIR = Path("/run/clusterrun-sandbox")
MAX_HOSTS = 240  # .11 .. .250 of one /24
MAX_NETWORKS = 9  # keeps veth names within IFNAMSIZ (15 chars)
ROUTE_TYPES = frozenset(
    ["unicast", "local", "broadcast", "multicast", "anycast", "unreachable", "blackhole",
     "prohibit", "throw", "nat"]
)
DECOY = ("virbr0", "virbr0-nic", "192.168.122.1/24")  # libvirt's default bridge, on every host
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}$")


def run(
    argv: Sequence[str], *, step: str, input: str | None = None, timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a command; any failure becomes a SandboxError naming the step, command and stderr."""
    cmd = shlex.join(argv)
    try:
        cp = subprocess.run(
            list(argv), input=input, capture_output=True, text=True, timeout=timeout,
            check=False, env=env,
        )
    except OSError as exc:
        raise SandboxError(f"{step}: cannot run `{cmd}`: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{step}: `{cmd}` did not finish within {timeout:g} s") from None
    if cp.returncode != 0:
        detail = (cp.stderr or cp.stdout).strip() or "(no output)"
        raise SandboxError(f"{step}: `{cmd}` failed with exit status {cp.returncode}: {detail}")
    return cp.stdout


def ip_batch(lines: Sequence[str], *, step: str, netns: str | None = None) -> None:
    """One `ip -batch` process for many changes: forking `ip` per change dominates build time."""
    if not lines:
        return
    argv = ["ip", "-n", netns, "-batch", "-"] if netns else ["ip", "-batch", "-"]
    run(argv, step=step, input="\n".join(lines) + "\n")


# ---------------------------------------------------------------- names


def bridge_name(prefix: str, net: int = 0) -> str:
    return f"crb{prefix}" if net == 0 else f"crb{prefix}n{net}"


def veth_name(prefix: str, k: int, net: int = 0) -> str:
    return f"cr{prefix}v{k}" if net == 0 else f"cr{prefix}n{net}v{k}"


def netns_name(prefix: str, k: int) -> str:
    return f"cr-{prefix}-node{k}"


def owned_link(prefix: str, name: str) -> bool:
    # 'n' and 'v' are not hex digits, so another sandbox's names can never match these.
    return re.fullmatch(rf"crb{prefix}(n\d+)?|cr{prefix}(n\d+)?v\d+", name) is not None


def nic_name(k: int, n_hosts: int, net: int = 0) -> str:
    """Interface name of host k (1-based) on network `net` (0 = the first).

    Real clusters mix naming schemes, so neighbouring hosts never share a name, and names on an
    added network never reuse one from another network of the same sandbox.
    """
    r, family = divmod(k - 1, 4)
    if net == 0:
        return [f"eth{r}", f"ens{5 + r}", f"enp{3 + r}s0", f"eno{1 + r}"][family]
    rounds = -(-n_hosts // 4)
    base = net * rounds
    return [
        f"ib{(net - 1) * rounds + r}",
        f"ens{5 + base + r}",
        f"enp{3 + r}s{net}",
        f"eno{1 + base + r}",
    ][family]


def host_address(subnet: str, k: int) -> str:
    return str(ipaddress.ip_network(subnet)[10 + k])


def gateway_address(subnet: str) -> str:
    return str(ipaddress.ip_network(subnet)[1])


# ---------------------------------------------------------------- allocation


@contextlib.contextmanager
def allocation_lock() -> Iterator[None]:
    """Serialise picking names and subnets between concurrent sandboxes on this machine."""
    RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(RUN_DIR / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def link_names() -> list[str]:
    out = run(["ip", "-o", "link", "show"], step="list network interfaces")
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def netns_names() -> list[str]:
    out = run(["ip", "netns", "list"], step="list network namespaces")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def new_prefix() -> str:
    """A 6-hex tag no live sandbox uses. Call with allocation_lock() held."""
    links, spaces = link_names(), netns_names()
    for _ in range(100):
        prefix = secrets.token_hex(3)
        if (RUN_DIR / prefix).exists() or any(s.startswith(f"cr-{prefix}-") for s in spaces):
            continue
        if not any(owned_link(prefix, name) for name in links):
            return prefix
    raise SandboxError("could not find an unused sandbox name prefix (too many sandboxes?)")


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network configured or routed here (other sandboxes' bridges included)."""
    found: list[ipaddress.IPv4Network] = []
    addrs = run(["ip", "-4", "-o", "addr", "show"], step="list IPv4 addresses")
    for line in addrs.splitlines():
        fields = line.split()
        if "inet" in fields:
            cidr = fields[fields.index("inet") + 1]
            found.append(ipaddress.IPv4Interface(cidr).network)
    routes = run(["ip", "-4", "-o", "route", "show", "table", "all"], step="list IPv4 routes")
    for line in routes.splitlines():
        fields = line.split()
        if not fields:
            continue
        dest = fields[1] if fields[0] in ROUTE_TYPES and len(fields) > 1 else fields[0]
        with contextlib.suppress(ValueError):
            found.append(ipaddress.IPv4Network(dest, strict=False))
    return found


def free_subnet() -> str:
    """A random 10.x.y.0/24 overlapping nothing in use. Call with allocation_lock() held."""
    used = [net for net in used_networks() if net.prefixlen > 0]
    rng = random.SystemRandom()
    for _ in range(500):
        # 10.0.x and 10.255.x are the most common picks of other software; stay clear of them.
        candidate = ipaddress.IPv4Network(f"10.{rng.randint(1, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return str(candidate)
    raise SandboxError("no free /24 left in 10.0.0.0/8 for a sandbox network")


# ---------------------------------------------------------------- teardown


def netns_pids(netns: str) -> list[int]:
    cp = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30, check=False
    )
    if cp.returncode != 0:
        if netns not in netns_names():
            return []
        raise SandboxError(f"`ip netns pids {netns}` failed: {cp.stderr.strip()}")
    return [int(tok) for tok in cp.stdout.split()]


def kill_netns_processes(netns: str, *, timeout: float = 15.0) -> None:
    """SIGKILL everything in a namespace until it stays empty (processes may be forking)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise SandboxError(f"processes {pids} in namespace {netns} survive SIGKILL")
        time.sleep(0.02)


def delete_quietly(argv: Sequence[str], errors: list[str]) -> None:
    """Delete a kernel object; an object that is already gone is success, not an error."""
    cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    # "No such device": a veth whose peer's namespace was just deleted, which the kernel
    # destroys a moment later, between the listing of links and this delete.
    missing = ("Cannot find device", "No such device", "No such file", "does not exist",
               "Cannot open")
    if cp.returncode != 0 and not any(m in cp.stderr for m in missing):
        errors.append(f"`{shlex.join(argv)}`: {cp.stderr.strip()}")


def remove_kernel_objects(prefix: str, netns: Sequence[str], links: Sequence[str]) -> list[str]:
    """Kill, then delete namespaces and links, named or left over with this prefix."""
    errors: list[str] = []
    spaces = set(netns) | {s for s in netns_names() if s.startswith(f"cr-{prefix}-")}
    for space in sorted(spaces):
        try:
            kill_netns_processes(space)
        except SandboxError as exc:
            errors.append(exc.message)
        delete_quietly(["ip", "netns", "delete", space], errors)
    # Deleting a namespace destroys its veth ends, and with them the peers here; what remains
    # are bridges and veths of a build that failed before moving a peer into its namespace.
    leftovers = set(links) | {name for name in link_names() if owned_link(prefix, name)}
    present = set(link_names())
    for name in sorted(leftovers & present):
        delete_quietly(["ip", "link", "delete", name], errors)
    return errors


# ---------------------------------------------------------------- building


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Turn an OS-level failure inside a build step into a SandboxError naming the step."""
    try:
        yield
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxError(f"{name}: {exc}") from exc


def parallel(fn: Callable[[_T], object], items: Iterable[_T]) -> None:
    items = list(items)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(items)))) as pool:
        for _ in pool.map(fn, items):
            pass


def bridge_lines(bridge: str, address: str, plen: str) -> list[str]:
    return [f"link add {bridge} type bridge", f"addr add {address}/{plen} dev {bridge}",
            f"link set {bridge} up"]


def veth_lines(netns: str, veth: str, ifname: str, bridge: str) -> list[str]:
    return [f"link add {veth} type veth peer name {ifname} netns {netns}",
            f"link set {veth} master {bridge} up"]


def inside_lines(host: SandboxHost, *, decoy: bool) -> list[str]:
    lines = ["link set lo up", f"addr add {host.address}/24 dev {host.ifname}",
             f"link set {host.ifname} up"]
    if decoy:
        # A veth pair stands in for libvirt's bridge: this kernel has no `dummy` link type.
        bridge, peer, address = DECOY
        lines += [f"link add {bridge} type veth peer name {peer}",
                  f"addr add {address} dev {bridge}", f"link set {peer} up",
                  f"link set {bridge} up"]
    return lines


def check_new_ifnames(hosts: Sequence[SandboxHost], networks: Sequence[SandboxNetwork],
                      names: list[str]) -> None:
    if len(names) != len(hosts):
        raise SandboxError(f"add_network needs one interface name per host ({len(hosts)}), "
                           f"got {len(names)}")
    for host, name in zip(hosts, names):
        taken = {"lo", host.ifname, *DECOY[:2]} | {
            nic.ifname for nw in networks for nic in nw.nics if nic.host == host.name}
        if not IFNAME_RE.match(name) or name in taken:
            raise SandboxError(f"{name!r} cannot be a new interface on {host.name}: names are "
                               f"1-15 of [A-Za-z0-9_.-] and not one of {sorted(taken)}")
