"""One host's facts as the probe reports them (clusterrun/remote/probe/probe.py), read once into
frozen values for the checks: ``HostFacts.from_json(reply)``. The wire format is the probe's;
the raw reply stays in ``HostReport.facts`` for what is passed on as it came (plan, launch).

A field the probe did not send, or sent with another type, reads as what the checks have
always made of a missing one: unknown (None) where they say so, else empty."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from clusterrun.jsonfields import flag, integer, integers, obj, text
from clusterrun.preflight import limit_facts, net_facts
from clusterrun.preflight.gpu_facts import NvidiaFacts
from clusterrun.preflight.limit_facts import IbPort, Limits
from clusterrun.preflight.net_facts import Interface, Link, Lookup, Names

# Every fact the probe sends whatever the host is like (remote/probe/probe.py facts(); `pyenv` only
# when an environment is asked for): one it left out is unknown, never taken as fine.
SENT = ("hostname", "user", "python", "python_path", "torch", "gpus", "nvidia", "interfaces",
        "ssh_server_address", "dns", "workdir", "rsync", "names", "port_range", "packages",
        "nccl", "limits", "links", "infiniband", "env", "machine", "ptrace", "cpus")


@dataclass(frozen=True)
class Workdir:
    """The probe's check of `workdir:` there: created and written (``ok``), and its free
    bytes at ``free_at``. ``found``: the check's record as sent, which hostpaths.py words when
    the workdir cannot be used."""

    ok: bool = False
    path: Optional[str] = None
    free: Optional[int] = None
    free_at: Optional[str] = None
    found: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: object) -> Workdir:
        found = obj(value)
        return cls(flag(found.get("ok")) is True, text(found.get("path")),
                   integer(found.get("free")), text(found.get("free_at")), dict(found))


@dataclass(frozen=True)
class Torch:
    """torch as the probe found it: its version, and the CUDA it was built with (None: a CPU
    build). ``says_cuda``: the probe reported the CUDA at all (an older one did not)."""

    version: Optional[str] = None
    cuda: Optional[str] = None
    says_cuda: bool = False

    @classmethod
    def from_json(cls, value: object) -> Optional[Torch]:
        """None: torch is not installed for that Python."""
        if not isinstance(value, dict):
            return None
        return cls(text(value.get("version")), text(value.get("cuda")), "cuda" in value)


@dataclass(frozen=True)
class Ptrace:
    """Whether a rank's stack can be read there (clusterrun/remote/probe/sysinfo.py ptrace()):
    Yama's scope (None: no Yama), root, CAP_SYS_PTRACE, its own py-spy, and its machine type
    (None: an older probe that did not say)."""

    scope: Optional[int] = None
    root: bool = False
    cap_sys_ptrace: bool = False
    pyspy: Optional[str] = None
    machine: Optional[str] = None

    @classmethod
    def from_json(cls, value: object) -> Optional[Ptrace]:
        """None: the probe did not report the ptrace permissions."""
        if not isinstance(value, dict):
            return None
        machine = value.get("machine")
        return cls(integer(value.get("scope")), bool(value.get("root")),
                   bool(value.get("cap_sys_ptrace")), text(value.get("pyspy")),
                   None if machine is None else str(machine))


@dataclass(frozen=True)
class Machine:
    """Which running system the entry reached: the kernel's boot id (else /etc/machine-id)
    and the network namespace's inode."""

    system: Optional[str] = None
    netns: Optional[int] = None

    @classmethod
    def from_json(cls, value: object) -> Machine:
        found = obj(value)
        system = found.get("boot_id") or found.get("machine_id")
        return cls(str(system) if system else None, integer(found.get("netns")))


@dataclass(frozen=True)
class HostFacts:
    """``gpus``: how many GPUs nvidia-smi sees (0 also when unknown); ``nvidia``: its details,
    None when the probe sent none; ``infiniband``: device -> port -> state ({}: no RDMA stack,
    None: not reported); ``env``: the NCCL/Gloo variables of the host's own environment;
    ``nccl`` with ``says_nccl``: the NCCL torch loads (None: none), if the probe said;
    ``packages``: name -> version (None: not reported); ``links``: interface -> MTU and speed;
    ``port_range``: net.ipv4.ip_local_port_range; ``unsent``: the facts of ``SENT`` the reply
    lacks (the checks say those are unknown); ``cpus``: the CPUs the probe could run on, as
    torchrun counts them for `--nproc-per-node cpu` (None: an older probe's reply)."""

    hostname: Optional[str] = None
    user: Optional[str] = None
    python: Optional[str] = None
    python_path: Optional[str] = None
    torch: Optional[Torch] = None
    gpus: int = 0
    nvidia: Optional[NvidiaFacts] = None
    interfaces: tuple[Interface, ...] = ()
    ssh_server_address: Optional[str] = None
    dns: Lookup = field(default_factory=Lookup)
    workdir: Workdir = field(default_factory=Workdir)
    names: Names = field(default_factory=Names)
    port_range: Optional[tuple[int, ...]] = None
    packages: Optional[Mapping[str, str]] = None
    nccl: Optional[str] = None
    says_nccl: bool = False
    limits: Limits = field(default_factory=Limits)
    links: Mapping[str, Link] = field(default_factory=dict)
    infiniband: Optional[Mapping[str, Mapping[str, IbPort]]] = None
    env: Mapping[str, str] = field(default_factory=dict)
    machine: Machine = field(default_factory=Machine)
    ptrace: Optional[Ptrace] = None
    cpus: Optional[int] = None  # the CPUs the probe may run on; None: not reported
    unsent: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, reply: Mapping[str, object]) -> HostFacts:
        packages = reply.get("packages")
        return cls(
            hostname=text(reply.get("hostname")), user=text(reply.get("user")),
            python=text(reply.get("python")), python_path=text(reply.get("python_path")),
            torch=Torch.from_json(reply.get("torch")),
            gpus=integer(reply.get("gpus")) or 0,
            nvidia=NvidiaFacts.from_json(reply.get("nvidia")),
            interfaces=net_facts.interfaces(reply.get("interfaces")),
            ssh_server_address=text(reply.get("ssh_server_address")),
            dns=Lookup.from_json(reply.get("dns")),
            workdir=Workdir.from_json(reply.get("workdir")),
            names=Names.from_json(reply.get("names")),
            port_range=integers(reply.get("port_range")) or None,
            packages={str(k): str(v) for k, v in packages.items()}
            if isinstance(packages, dict) else None,
            nccl=text(reply.get("nccl")), says_nccl="nccl" in reply,
            limits=Limits.from_json(reply.get("limits")),
            links=net_facts.links(reply.get("links")),
            infiniband=limit_facts.infiniband(reply),
            env={str(k): str(v) for k, v in obj(reply.get("env")).items()},
            machine=Machine.from_json(reply.get("machine")),
            ptrace=Ptrace.from_json(reply.get("ptrace")),
            cpus=integer(reply.get("cpus")),
            unsent=frozenset(key for key in SENT if key not in reply))
