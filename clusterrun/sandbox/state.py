"""What a sandbox keeps in ROOT/sandbox.json: every kernel object and process it built, so that
`sandbox down` (in any process, any time later) finds all of them, and what each add-on
the test suite puts on a sandbox (tests/support/: containers, docker, slurm) recorded.

Each record has one to_json/from_json; they read and write the file's layout as it has always
been, so a sandbox built by an older clusterrun is still read, and removed, by a newer one.
from_json checks every value's type: a damaged file is a ValueError naming the value, not a
KeyError somewhere in down().
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeVar, Union

# A JSON document as json.loads returns it, before from_json has checked it.
Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]
Status = Literal["building", "up"]
VERSION = 1
_R = TypeVar("_R")


@dataclass(frozen=True)
class SandboxHost:
    name: str
    netns: str
    ifname: str
    address: str
    veth: str  # host side, in the root namespace: `ip link set VETH down` cuts the cable
    sshd_pid: int  # 0 until its sshd accepts connections

    def to_json(self) -> dict[str, Json]:
        return {"name": self.name, "netns": self.netns, "ifname": self.ifname,
                "address": self.address, "veth": self.veth, "sshd_pid": self.sshd_pid}

    @classmethod
    def from_json(cls, value: Json) -> SandboxHost:
        doc = _object(value, "a host")
        return cls(name=_str(doc, "name"), netns=_str(doc, "netns"), ifname=_str(doc, "ifname"),
                   address=_str(doc, "address"), veth=_str(doc, "veth"),
                   sshd_pid=_int(doc, "sshd_pid"))


@dataclass(frozen=True)
class SandboxNic:
    host: str
    ifname: str
    address: str
    veth: str

    def to_json(self) -> dict[str, Json]:
        return {"host": self.host, "ifname": self.ifname, "address": self.address,
                "veth": self.veth}

    @classmethod
    def from_json(cls, value: Json) -> SandboxNic:
        doc = _object(value, "a NIC")
        return cls(host=_str(doc, "host"), ifname=_str(doc, "ifname"),
                   address=_str(doc, "address"), veth=_str(doc, "veth"))


@dataclass(frozen=True)
class SandboxNetwork:
    """A network added by add_network(): its own bridge and one more NIC per host."""

    bridge: str
    subnet: str
    controller_address: str
    nics: tuple[SandboxNic, ...]

    def to_json(self) -> dict[str, Json]:
        return {"bridge": self.bridge, "subnet": self.subnet,
                "controller_address": self.controller_address,
                "nics": [nic.to_json() for nic in self.nics]}

    @classmethod
    def from_json(cls, value: Json) -> SandboxNetwork:
        doc = _object(value, "a network")
        return cls(bridge=_str(doc, "bridge"), subnet=_str(doc, "subnet"),
                   controller_address=_str(doc, "controller_address"),
                   nics=tuple(SandboxNic.from_json(v) for v in _list(doc, "nics")))


@dataclass(frozen=True)
class DaemonRecord:
    """A daemon an add-on started (see sandbox.daemons): by pid and start time, so that a reused
    pid is never signalled. start is -1 for one that died before it could be read."""

    name: str
    pid: int
    start: int

    def to_json(self) -> dict[str, Json]:
        return {"name": self.name, "pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, value: Json) -> DaemonRecord:
        doc = _object(value, "a daemon")
        return cls(name=_str(doc, "name"), pid=_int(doc, "pid"), start=_int(doc, "start"))


@dataclass
class ContainersState:
    """tests/support/containers.py: the hosts with a podman of their own (down() removes their
    containers), and what the containers mount; mounts is None until first asked of Python."""

    path: str
    hosts: list[str]
    mounts: list[str] | None = None
    image: bool = False  # imported into the shared image store

    def to_json(self) -> dict[str, Json]:
        return {"hosts": list(self.hosts), "mounts": _strs_or_none(self.mounts),
                "path": self.path, "image": self.image}

    @classmethod
    def from_json(cls, value: Json) -> ContainersState:
        doc = _object(value, "the containers")
        return cls(path=_str(doc, "path"), hosts=_strs(doc, "hosts"),
                   mounts=_optional_strs(doc, "mounts"), image=_bool(doc, "image"))


@dataclass(frozen=True)
class DockerHost:
    daemon: DaemonRecord
    cgroup: str  # the parent of the host's containers' cgroups, in every hierarchy

    def to_json(self) -> dict[str, Json]:
        return {"daemon": self.daemon.to_json(), "cgroup": self.cgroup}

    @classmethod
    def from_json(cls, value: Json) -> DockerHost:
        doc = _object(value, "a docker host")
        return cls(daemon=DaemonRecord.from_json(doc.get("daemon")), cgroup=_str(doc, "cgroup"))


@dataclass
class DockerState:
    """tests/support/docker.py: the hosts running a dockerd of their own, by host name."""

    path: str
    hosts: dict[str, DockerHost]
    mounts: list[str] | None = None

    def to_json(self) -> dict[str, Json]:
        return {"hosts": {name: host.to_json() for name, host in self.hosts.items()},
                "mounts": _strs_or_none(self.mounts), "path": self.path}

    @classmethod
    def from_json(cls, value: Json) -> DockerState:
        doc = _object(value, "docker")
        hosts = _object(doc.get("hosts"), "docker's hosts")
        return cls(path=_str(doc, "path"), mounts=_optional_strs(doc, "mounts"),
                   hosts={name: DockerHost.from_json(host) for name, host in hosts.items()})


@dataclass
class SlurmState:
    """tests/support/slurm.py: the controller's namespace and address, the node hosts, and the
    daemons started, in groups in the order down() stops them (slurmd, slurmctld, munged)."""

    nodes: tuple[str, ...]
    netns: str
    veth: str
    address: str
    daemons: list[list[DaemonRecord]]

    def to_json(self) -> dict[str, Json]:
        return {"nodes": list(self.nodes), "netns": self.netns, "veth": self.veth,
                "address": self.address,
                "daemons": [[r.to_json() for r in group] for group in self.daemons]}

    @classmethod
    def from_json(cls, value: Json) -> SlurmState:
        doc = _object(value, "Slurm")
        groups = [_array(group, "a group of Slurm's daemons") for group in _list(doc, "daemons")]
        return cls(nodes=tuple(_strs(doc, "nodes")), netns=_str(doc, "netns"),
                   veth=_str(doc, "veth"), address=_str(doc, "address"),
                   daemons=[[DaemonRecord.from_json(r) for r in group] for group in groups])


@dataclass
class SandboxState:
    """The whole file. Plain, not frozen: building a sandbox and enabling its add-ons fill it
    in step by step, each step written out before the next builds anything."""

    created_root: bool  # down() removes the root directory too
    decoy: bool
    python: str  # the hosts' Python, as given to `sandbox up`
    rc_file: str | None
    rc_text: str
    prefix: str  # in the name of every kernel object the sandbox made
    bridge: str
    subnet: str
    controller_address: str
    view: str  # where the hosts see the sandbox root (under /run: not hidden by their /tmp)
    hosts: tuple[SandboxHost, ...]
    networks: tuple[SandboxNetwork, ...] = ()
    status: Status = "building"
    containers: ContainersState | None = None
    docker: DockerState | None = None
    slurm: SlurmState | None = None
    version: int = VERSION

    def host(self, name: str) -> SandboxHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def set_pids(self, pids: dict[str, int]) -> None:
        """Record the sshd pid of these hosts (by name)."""
        self.hosts = tuple(replace(h, sshd_pid=pids.get(h.name, h.sshd_pid))
                           for h in self.hosts)

    def to_json(self) -> dict[str, Json]:
        doc: dict[str, Json] = {
            "version": self.version, "status": self.status, "created_root": self.created_root,
            "decoy": self.decoy, "python": self.python,
            "hosts": [h.to_json() for h in self.hosts],
            "networks": [nw.to_json() for nw in self.networks],
            "rc_file": self.rc_file, "rc_text": self.rc_text, "prefix": self.prefix,
            "bridge": self.bridge, "subnet": self.subnet,
            "controller_address": self.controller_address, "view": self.view,
        }
        if self.containers is not None:
            doc["containers"] = self.containers.to_json()
        if self.docker is not None:
            doc["docker"] = self.docker.to_json()
        if self.slurm is not None:
            doc["slurm"] = self.slurm.to_json()
        return doc

    @classmethod
    def from_json(cls, value: Json) -> SandboxState:
        doc = _object(value, "the sandbox state")
        rc_file = doc.get("rc_file")
        if rc_file is not None and not isinstance(rc_file, str):
            raise ValueError(f"rc_file is {rc_file!r}, not a path")
        return cls(
            version=_int(doc, "version"), status=_status(_str(doc, "status")),
            created_root=_bool(doc, "created_root"), decoy=_bool(doc, "decoy"),
            python=_str(doc, "python"), rc_file=rc_file, rc_text=_str(doc, "rc_text", ""),
            prefix=_str(doc, "prefix"), bridge=_str(doc, "bridge"), subnet=_str(doc, "subnet"),
            controller_address=_str(doc, "controller_address"), view=_str(doc, "view"),
            hosts=tuple(SandboxHost.from_json(h) for h in _list(doc, "hosts")),
            networks=tuple(SandboxNetwork.from_json(nw) for nw in _list(doc, "networks")),
            containers=_optional(doc, "containers", ContainersState.from_json),
            docker=_optional(doc, "docker", DockerState.from_json),
            slurm=_optional(doc, "slurm", SlurmState.from_json),
        )


# ---------------------------------------------------------------- checking what json.loads gave


def _object(value: Json, what: str) -> dict[str, Json]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {value!r}, not an object")
    return value


def _array(value: Json, what: str) -> list[Json]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is {value!r}, not a list")
    return value


def _list(doc: dict[str, Json], key: str) -> list[Json]:
    return _array(doc.get(key), key)


def _str(doc: dict[str, Json], key: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} is {value!r}, not a string")
    return value


def _int(doc: dict[str, Json], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not a whole number")
    return value


def _bool(doc: dict[str, Json], key: str) -> bool:
    value = doc.get(key)
    if not isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not true or false")
    return value


def _strs(doc: dict[str, Json], key: str) -> list[str]:
    strings = []
    for value in _list(doc, key):
        if not isinstance(value, str):
            raise ValueError(f"{key} holds {value!r}, not a string")
        strings.append(value)
    return strings


def _optional_strs(doc: dict[str, Json], key: str) -> list[str] | None:
    return None if doc.get(key) is None else _strs(doc, key)


def _strs_or_none(values: list[str] | None) -> Json:
    return None if values is None else [*values]


def _status(value: str) -> Status:
    if value == "up":
        return "up"
    if value == "building":
        return "building"
    raise ValueError(f"status is {value!r}, not building or up")


def _optional(doc: dict[str, Json], key: str, parse: Callable[[Json], _R]) -> _R | None:
    value = doc.get(key)
    return None if value is None else parse(value)
