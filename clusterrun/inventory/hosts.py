"""The inventory's hosts as frozen dataclasses, defaults applied. No network here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from clusterrun.home import home_setting

if TYPE_CHECKING:  # read by inventory/lockfile.py only for an inventory with `environment:`
    from clusterrun.inventory.pylock import PythonEnv

AUTO = "auto"
# nproc_per_node's words, as torchrun's --nproc-per-node takes them: resolved on each host from
# what preflight found there (plan/build.py).
GPU = "gpu"
CPU = "cpu"
PER_HOST = (AUTO, GPU, CPU)

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})

DEFAULTS: dict[str, Any] = {
    "user": None,
    "port": None,
    "identity_file": None,
    "known_hosts": "~/.ssh/known_hosts",
    "python": None,  # python3 on remote hosts; this very interpreter on local ones
    "setup": None,
    "workdir": None,  # REMOTE_WORKDIR on remote hosts; local_workdir() on this machine
    "nproc_per_node": AUTO,
    "interface": AUTO,
    "env": {},
    "forward_env": (),
    "env_file": None,
    "container": None,
    "container_engine": None,  # None: docker if the host has it, else podman
    "container_user": None,  # None: the container's own user
    "proxy_jump": None,  # [user@]host[:port] of a bastion every connection goes through
    "environment": None,  # a PythonEnv: the lock every host builds (docs/environments.md)
}


REMOTE_WORKDIR = "~/clusterrun"


def local_workdir() -> str:
    """Local hosts keep their files beside clusterrun's own state: $CLUSTERRUN_HOME/local-nodes
    (default ~/.clusterrun/local-nodes), so pointing CLUSTERRUN_HOME elsewhere moves them too."""
    return f"{home_setting()}/local-nodes"


def where_it_runs(*, own: bool) -> tuple[str, str]:
    """The python and workdir a host gets when nothing names them: a host that sees this
    machine's files as they are (local, not in a container) runs clusterrun's own interpreter
    and keeps its files under $CLUSTERRUN_HOME; any other host, python3 and ~/clusterrun."""
    import sys

    return (sys.executable, local_workdir()) if own else ("python3", REMOTE_WORKDIR)


@dataclass(frozen=True)
class HostSpec:
    """One host as the inventory describes it, defaults applied."""

    host: str
    name: str
    master: bool
    line: int
    user: Optional[str] = None  # None: ~/.ssh/config, else the local user
    port: Optional[int] = None  # None: ~/.ssh/config, else 22
    identity_file: Optional[str] = None
    known_hosts: str = "~/.ssh/known_hosts"
    python: str = "python3"
    setup: Optional[str] = None
    workdir: str = REMOTE_WORKDIR
    nproc_per_node: Union[int, str] = AUTO
    interface: str = AUTO
    env: tuple[tuple[str, str], ...] = ()
    gpus: Optional[tuple[int, ...]] = None
    forward_env: tuple[str, ...] = ()  # more names (globs) forwarded from the controller's env
    env_file: Optional[str] = None  # a dotenv file on the controller, as an absolute path
    source: Optional[str] = None  # the file `line` is in (a hostfile); None: the inventory
    container: Optional[str] = None  # a running container everything on this host runs in
    container_engine: Optional[str] = None  # docker or podman; None: whichever the host has
    container_user: Optional[str] = None
    proxy_jump: Optional[str] = None  # [user@]host[:port]; None: direct (or ~/.ssh/config's)
    transport: str = "ssh"  # or "srun": a node of the Slurm job `slurm_job`, reached by job steps
    slurm_job: Optional[str] = None
    spare: bool = False  # kept out of the first attempt; takes a failed host's place on a restart
    environment: Optional[PythonEnv] = None  # `environment:`: built under <workdir>/envs/

    @property
    def jump(self) -> Optional[tuple[Optional[str], str, Optional[int]]]:
        """``proxy_jump`` as (user, host, port); user and port None when not given."""
        if not self.proxy_jump:
            return None
        user, _, rest = self.proxy_jump.rpartition("@")
        host, port = rest, None
        if rest.startswith("["):  # [IPv6]:port
            host, _, tail = rest[1:].partition("]")
            port = int(tail[1:]) if tail.startswith(":") else None
        elif rest.count(":") == 1:
            host, _, digits = rest.partition(":")
            port = int(digits)
        return (user or None, host, port)

    @property
    def local(self) -> bool:
        """True for this machine itself: reached without SSH."""
        return self.host in LOCAL_HOSTS

    @property
    def own_files(self) -> bool:
        """True when this host sees this machine's files as they are: local and not in a
        container, so nothing is copied to it."""
        return self.local and not self.container

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: tuple[HostSpec, ...]
    master_addr: str = AUTO  # or an IP address
    master_port: Optional[int] = None  # None: a free port checked on the master
    master_named: bool = False  # a host says `master: true` (not just the first one)
    adhoc: bool = False  # hosts named on the command line (`gpu[01-04]`), no file

    @property
    def master(self) -> HostSpec:
        return next(h for h in self.hosts if h.master)

    @property
    def active(self) -> tuple[HostSpec, ...]:
        """The hosts a run starts on (every one but the spares), in inventory order."""
        return tuple(h for h in self.hosts if not h.spare)

    @property
    def spares(self) -> tuple[HostSpec, ...]:
        """The hosts held back for restarts (`spare: true`), in inventory order."""
        return tuple(h for h in self.hosts if h.spare)
