"""A real multi-host cluster on one Linux machine, for trying and testing clusterrun.

Each host is a network namespace on a shared bridge, running its own OpenSSH sshd inside private
UTS and mount namespaces, so it has its own hostname, /tmp, /etc/hosts and /etc/resolv.conf.
Needs Linux and root; `support.require_support()` says what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clusterrun.errors import SandboxError
from clusterrun.sandbox import daemons, dockerd, neighbours, net, sshd
from clusterrun.sandbox.state import SandboxHost, SandboxNetwork, SandboxNic, SandboxState
from clusterrun.sandbox.support import require_support

STATE_FILE = "sandbox.json"
PARTITION_TABLE = "clusterrun_partition"
_KEY = sshd.KEY


@dataclass(frozen=True)
class Sandbox:
    root: Path
    prefix: str
    bridge: str
    subnet: str
    controller_address: str
    hosts: tuple[SandboxHost, ...]
    inventory: Path
    identity_file: Path
    known_hosts: Path
    decoy: bool
    networks: tuple[SandboxNetwork, ...] = ()

    def host(self, name: str) -> SandboxHost:
        for host in self.hosts:
            if host.name == name:
                return host
        names = ", ".join(h.name for h in self.hosts)
        raise SandboxError(f"no host {name!r} in the sandbox at {self.root} (hosts: {names})")


def up(n: int, root: Path, *, decoy: bool = False, python: str = sys.executable,
       rc_file: Path | None = None) -> Sandbox:
    """Build an n-host sandbox under root (new or empty; made 0700) and return it; ``rc_file``:
    see sshd.bashrc."""
    require_support()
    if not 1 <= n <= net.MAX_HOSTS:
        raise SandboxError(f"a sandbox has 1 to {net.MAX_HOSTS} hosts, not {n}")
    rc_text, root = sshd.rc_text(rc_file), Path(root).resolve()
    created = _prepare_root(root)
    try:
        state = _build(root, n, created=created, decoy=decoy, python=python,
                       rc_file=str(rc_file) if rc_file else None, rc_text=rc_text)
    except BaseException as exc:
        leftovers = _cleanup_after_failure(root, created=created)
        if not isinstance(exc, SandboxError):
            raise
        raise SandboxError(f"sandbox up failed: {exc.message}{leftovers}") from exc
    return _from_state(root, state)


def down(root: Path) -> None:
    """Remove the sandbox at root: processes, namespaces, links, files. Idempotent."""
    root = Path(root).resolve()
    if not (root / STATE_FILE).exists():
        return  # never built, or already removed; a directory without state is not ours to wipe
    state = read_state(root)
    prefix = state.prefix
    links = [state.bridge] + [h.veth for h in state.hosts]
    for network in state.networks:
        links += [network.bridge] + [nic.veth for nic in network.nics]
    spaces = {h.netns for h in state.hosts}
    docker = state.docker.hosts if state.docker else {}  # tests/support/docker.py
    errors = dockerd.stop(state.hosts, docker, state.view)
    enabled = set(state.containers.hosts if state.containers else [])  # tests/support/containers.py
    sshd.remove_containers(root, [h for h in state.hosts if h.name in enabled])
    errors += daemons.stop(state.slurm.daemons if state.slurm else [])  # tests/support/slurm.py
    errors += net.remove_kernel_objects(prefix, sorted(spaces), links)
    sshd.reap_children(spaces)
    with contextlib.suppress(OSError):
        (net.RUN_DIR / prefix).rmdir()
    neighbours.restore_if_last()
    if errors:
        raise SandboxError(
            f"sandbox down left things behind (state kept in {root}, run down again): "
            + "; ".join(errors)
        )
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if state.created_root:
        with contextlib.suppress(OSError):
            root.rmdir()


def load(root: Path) -> Sandbox:
    root = Path(root).resolve()
    state = read_state(root)
    if state.status != "up":
        raise SandboxError(f"the sandbox at {root} was never completely built; run down on it")
    return _from_state(root, state)


def add_network(sb: Sandbox, *, ifnames: Sequence[str] | None = None) -> dict[str, str]:
    """Give every host one more NIC on a new bridge and /24; return {host name: new address}."""
    state = read_state(sb.root)
    index = len(state.networks) + 1
    if index > net.MAX_NETWORKS:
        raise SandboxError(f"a sandbox has at most {net.MAX_NETWORKS} added networks")
    hosts = state.hosts
    names = list(ifnames) if ifnames is not None else [
        net.nic_name(k, len(hosts), index) for k in range(1, len(hosts) + 1)
    ]
    net.check_new_ifnames(hosts, state.networks, names)
    with net.allocation_lock():
        subnet = net.free_subnet()
        entry = SandboxNetwork(
            bridge=net.bridge_name(state.prefix, index), subnet=subnet,
            controller_address=net.gateway_address(subnet),
            nics=tuple(SandboxNic(host=h.name, ifname=name, address=net.host_address(subnet, k),
                                  veth=net.veth_name(state.prefix, k, index))
                       for k, (h, name) in enumerate(zip(hosts, names), 1)))
        before, state.networks = state.networks, (*state.networks, entry)
        write_state(sb.root, state)  # first, so that down() removes whatever gets built
        try:
            _wire_network(hosts, entry)
        except SandboxError:
            errors: list[str] = []
            present = net.link_names()
            for link in [entry.bridge] + [nic.veth for nic in entry.nics]:
                if link in present:
                    net.delete_quietly(["ip", "link", "delete", link], errors)
            state.networks = before
            write_state(sb.root, state)
            raise
    return {nic.host: nic.address for nic in entry.nics}


def partition(sb: Sandbox, host_name: str) -> None:
    """Drop every packet in and out of the host except loopback, like a dead switch port."""
    host = sb.host(host_name)
    if shutil.which("nft") is None:
        raise SandboxError("partition needs nft: `apt-get install nftables`")
    rules = (
        f"table inet {PARTITION_TABLE}\ndelete table inet {PARTITION_TABLE}\n"
        f"table inet {PARTITION_TABLE} {{\n"
        "  chain input { type filter hook input priority 0; policy drop; iif lo accept; }\n"
        "  chain output { type filter hook output priority 0; policy drop; oif lo accept; }\n"
        "}\n"
    )
    net.run(["ip", "netns", "exec", host.netns, "nft", "-f", "-"], input=rules,
            step=f"partition {host_name}")


def heal(sb: Sandbox, host_name: str) -> None:
    host = sb.host(host_name)
    if shutil.which("nft") is None:
        return  # without nft there can be no partition; heal() often runs in a finally block
    # Declaring the table first makes the delete succeed whether or not it was partitioned.
    rules = f"table inet {PARTITION_TABLE}\ndelete table inet {PARTITION_TABLE}\n"
    net.run(["ip", "netns", "exec", host.netns, "nft", "-f", "-"], input=rules,
            step=f"heal {host_name}")


def pids(sb: Sandbox, host_name: str) -> list[int]:
    """Every process living in the host, except its sshd listener."""
    host = sb.host(host_name)
    return [pid for pid in net.netns_pids(host.netns) if pid != host.sshd_pid]


def exec_in(
    sb: Sandbox, host_name: str, argv: Sequence[str], **subprocess_kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """Run argv on the host: its network, hostname and mounts (its /tmp), as an SSH session sees."""
    if isinstance(argv, str):
        raise TypeError("exec_in takes an argument list, not a shell string")
    host = sb.host(host_name)
    cmd = ["nsenter", "-t", str(host.sshd_pid), "-m", "-u", "-n", "--", *argv]
    return subprocess.run(cmd, **subprocess_kwargs)  # noqa: PLW1510 (caller decides on check)


def regenerate_host_key(sb: Sandbox, host_name: str) -> None:
    """Give the host a new host key (known_hosts keeps the old one) and restart its sshd."""
    host = sb.host(host_name)
    key = sb.root / host.name / _KEY
    orig = key.with_name(_KEY + ".orig")
    with net.step(f"regenerate the host key of {host_name}"):
        if not orig.exists():
            os.replace(key, orig)
            os.replace(key.with_name(_KEY + ".pub"), orig.with_name(_KEY + ".orig.pub"))
        else:
            key.unlink(missing_ok=True)
            key.with_name(_KEY + ".pub").unlink(missing_ok=True)
        sshd.keygen(key, f"{host.name}@clusterrun-sandbox")
    sshd.restart(sb.root / host.name, host.netns, host.sshd_pid, host.address)


def restore_host_key(sb: Sandbox, host_name: str) -> None:
    host = sb.host(host_name)
    key = sb.root / host.name / _KEY
    orig = key.with_name(_KEY + ".orig")
    if not orig.exists():
        return  # the original key was never replaced
    with net.step(f"restore the host key of {host_name}"):
        os.replace(orig, key)
        os.replace(orig.with_name(_KEY + ".orig.pub"), key.with_name(_KEY + ".pub"))
    sshd.restart(sb.root / host.name, host.netns, host.sshd_pid, host.address)


# ---------------------------------------------------------------- building


def _prepare_root(root: Path) -> bool:
    """Create root (0700), or accept an empty directory; return whether we created it."""
    with net.step(f"prepare {root}"):
        if (root / STATE_FILE).exists():
            raise SandboxError(f"a sandbox already exists at {root}; run sandbox down first")
        created = not root.exists()
        if created:
            root.mkdir(mode=0o700, parents=True)
        elif not root.is_dir() or any(root.iterdir()):
            raise SandboxError(f"{root} is not an empty directory; pick a new one for the sandbox")
        root.chmod(0o700)
        return created


def _build(root: Path, n: int, *, created: bool, decoy: bool, python: str,
           rc_file: str | None, rc_text: str) -> SandboxState:
    with net.allocation_lock():
        prefix, subnet = net.new_prefix(), net.free_subnet()
        state = SandboxState(
            created_root=created, decoy=decoy, python=python, rc_file=rc_file, rc_text=rc_text,
            prefix=prefix, bridge=net.bridge_name(prefix), subnet=subnet,
            controller_address=net.gateway_address(subnet), view=str(net.RUN_DIR / prefix),
            hosts=tuple(SandboxHost(name=f"node{k}", netns=net.netns_name(prefix, k),
                                    ifname=net.nic_name(k, n), address=net.host_address(subnet, k),
                                    veth=net.veth_name(prefix, k), sshd_pid=0)
                        for k in range(1, n + 1)))
        write_state(root, state)  # before any kernel object exists, so down() finds them all
        with net.step("create the mount point directory"):
            (net.RUN_DIR / prefix).mkdir(mode=0o700)
        neighbours.make_room(n)
        # The bridge's address claims the subnet for sandboxes started after the lock is released.
        net.ip_batch(net.bridge_lines(state.bridge, state.controller_address, "24"),
                     step="create the bridge")
    hosts = state.hosts
    with net.step("write host files"):
        sshd.keygen(root / "id_ed25519", "clusterrun-sandbox")
        shutil.copyfile(root / "id_ed25519.pub", root / "authorized_keys")
        net.parallel(lambda h: sshd.write_host_files(root, state.view, h, hosts, state.rc_text),
                     hosts)
    net.ip_batch([line for h in hosts for line in
                  [f"netns add {h.netns}", *net.veth_lines(h.netns, h.veth, h.ifname,
                                                          state.bridge)]],
                 step="create namespaces and veth pairs")
    net.parallel(lambda h: net.ip_batch(net.inside_lines(h, decoy=state.decoy),
                                        step=f"configure {h.name}", netns=h.netns), hosts)
    with net.step("start sshd"):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        shared = sshd.shared_under_tmp(state.python)
        procs = {h.name: sshd.start(root, state.view, h, shared) for h in hosts}
    state.set_pids(sshd.wait_ready(root, hosts, procs))
    with net.step("write known_hosts and inventory"):
        keys = [sshd.pubkey(root / h.name / (_KEY + ".pub")) for h in state.hosts]
        known = "".join(f"{h.address} {key}\n" for h, key in zip(state.hosts, keys))
        sshd.write_private(root / "known_hosts", known)
        _write_inventory(root, state)
        state.status = "up"
        write_state(root, state)
    return state


def _wire_network(hosts: Sequence[SandboxHost], entry: SandboxNetwork) -> None:
    plen = entry.subnet.split("/")[1]
    net.ip_batch(net.bridge_lines(entry.bridge, entry.controller_address, plen),
                 step="add network: create the bridge")
    pairs = list(zip(hosts, entry.nics))
    net.ip_batch([line for h, nic in pairs
                  for line in net.veth_lines(h.netns, nic.veth, nic.ifname, entry.bridge)],
                 step="add network: create veth pairs")

    def configure(pair: tuple[SandboxHost, SandboxNic]) -> None:
        host, nic = pair
        net.ip_batch([f"addr add {nic.address}/{plen} dev {nic.ifname}",
                      f"link set {nic.ifname} up"],
                     step=f"add network: configure {host.name}", netns=host.netns)

    net.parallel(configure, pairs)


def _cleanup_after_failure(root: Path, *, created: bool) -> str:
    try:
        down(root)
        if created and root.exists() and not any(root.iterdir()):
            root.rmdir()  # failed before the state file existed
    except (SandboxError, OSError) as exc:
        return f" (cleanup also failed: {exc}; run sandbox down on {root})"
    return " (everything it had built was removed)"


# ---------------------------------------------------------------- files and state


def write_state(root: Path, state: SandboxState) -> None:
    sshd.write_private(root / STATE_FILE, json.dumps(state.to_json(), indent=2) + "\n")


def read_state(root: Path) -> SandboxState:
    try:
        return SandboxState.from_json(json.loads((root / STATE_FILE).read_text()))
    except FileNotFoundError:
        raise SandboxError(f"no sandbox at {root} ({STATE_FILE} is missing)") from None
    except (OSError, ValueError) as exc:
        raise SandboxError(f"cannot read {root / STATE_FILE}: {exc}") from None


def _write_inventory(root: Path, state: SandboxState) -> None:
    hosts = state.hosts
    doc = {
        "defaults": {"user": "root", "identity_file": str(root / "id_ed25519"),
                     "known_hosts": str(root / "known_hosts"), "python": state.python,
                     "workdir": "/tmp/clusterrun"},
        "hosts": [{"host": h.address, "name": h.name} for h in hosts],
    }
    header = (f"# clusterrun sandbox: {len(hosts)} hosts in network namespaces on this machine "
              "(clusterrun sandbox down removes them)\n")
    text = header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    (root / "inventory.yaml").write_text(text)


def _from_state(root: Path, state: SandboxState) -> Sandbox:
    return Sandbox(
        root=root, prefix=state.prefix, bridge=state.bridge, subnet=state.subnet,
        controller_address=state.controller_address, hosts=state.hosts,
        inventory=root / "inventory.yaml", identity_file=root / "id_ed25519",
        known_hosts=root / "known_hosts", decoy=state.decoy, networks=state.networks)
