"""A real Slurm in the sandbox, for testing `hosts: slurm`: a slurmd inside each enabled host's
namespaces, so that a job step runs where an SSH session would (the host's hostname, NIC, /tmp).

The controller is one more machine on the sandbox's bridge: namespace cr-PREFIX-slurmctld at
address .10 (hosts start at .11), with a hostname of its own, running slurmctld and munged (which
signs every Slurm message through its socket). Clients (salloc, srun, squeue) run on this machine
with SlurmCluster.env(). Every file lives under ROOT/slurm, which the hosts see at that same path
(bound over their own /tmp where it hides ROOT): srun hands the client's SLURM_CONF on to the
steps, and clients and slurmd must find munged's socket at one path. sandbox.down() stops the
daemons the state records (slurmd, slurmctld, munged), then removes the namespaces.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterrun.errors import SandboxError
from clusterrun.sandbox import cluster, daemons, net, sshd
from clusterrun.sandbox.state import DaemonRecord, SandboxState, SlurmState

PACKAGES = "slurmctld slurmd slurm-client munge"
DAEMONS = ("slurmd", "slurmctld", "munged")  # the order down() stops them in
CLIENTS = ("salloc", "srun", "sinfo", "squeue", "scancel", "scontrol")
SBIN = "/usr/sbin"  # where the daemons are, and off the PATH of many shells
CONTROLLER = "slurmctld"  # the controller's hostname and its namespace's suffix
PORT = 6817
DIR = "slurm"  # under the sandbox root
READY_TIMEOUT = 30.0
CLIENT_TIMEOUT = 30.0
# Settings of another Slurm, or of a job this process may run in, that a client would obey
# instead of the sandbox's (SLURM_JOB_ID would even make salloc nest in that job).
FOREIGN = ("SLURM", "SALLOC_", "SRUN_", "SBATCH_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")
# Slurm's configuration files have no quoting we could rely on for paths.
PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_./+-]*$")


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path  # slurm.conf, absolute: steps inherit it as SLURM_CONF and read it on the node
    nodes: tuple[str, ...]
    controller_address: str

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a client of this Slurm (salloc, srun, squeue...): base (this
        process's environment when None) less every Slurm setting, plus SLURM_CONF."""
        source = os.environ if base is None else base
        env = {k: v for k, v in source.items() if not k.startswith(FOREIGN)}
        env["SLURM_CONF"] = str(self.conf)
        path = env.get("PATH", "").split(os.pathsep)
        env["PATH"] = os.pathsep.join([p for p in path if p] + [
            d for d in ("/usr/bin", "/bin") if d not in path])
        return env

    def salloc_argv(self, n: int, nodes: Sequence[str] | None,
                    command: Sequence[str]) -> list[str]:
        """`salloc` for n nodes (these, when given), running command on this machine with the
        allocation's SLURM_* environment; without a command the allocation outlives salloc,
        until scancel. Run it with env=self.env()."""
        if n < 1:
            raise SandboxError(f"an allocation has at least one node, not {n}")
        argv = ["salloc", f"--nodes={n}"]
        if nodes:
            unknown = [name for name in nodes if name not in self.nodes]
            if unknown or len(nodes) > n:
                raise SandboxError(f"cannot allocate {n} of {', '.join(nodes)}: the Slurm "
                                   f"nodes are {', '.join(self.nodes)}")
            argv.append(f"--nodelist={','.join(nodes)}")
        return [*argv, "--", *command] if command else [*argv, "--no-shell"]

    def srun_argv(self, job: str, node: str, command: Sequence[str]) -> list[str]:
        """One task on one node of the job, sharing its CPUs with any other step (without
        --overlap a step waits for the one before it on the node to end)."""
        return ["srun", f"--jobid={job}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
                "--overlap", "--unbuffered", *command]


def require_slurm() -> None:
    """Raise SandboxError saying what to install when this machine cannot run Slurm."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if _tool(name) is None]
    if missing:
        raise SandboxError(
            f"Slurm in the sandbox needs {', '.join(missing)}: `apt-get install -y "
            f"--no-install-recommends {PACKAGES}` (with a /usr/sbin/policy-rc.d that exits 101, "
            "so that the packages start no system daemons)")


def enable(sb: cluster.Sandbox, hosts: Sequence[str]) -> SlurmCluster:
    """Make these hosts the nodes of a running Slurm, and wait until every one is idle.

    A sandbox runs one Slurm: enabling the same hosts again returns it, other hosts fail.
    """
    require_slurm()
    names = list(dict.fromkeys(sb.host(name).name for name in hosts))
    if not names:
        raise SandboxError("Slurm needs at least one host")
    home = sb.root / DIR
    if not PLAIN_PATH.match(str(home)):
        raise SandboxError(f"Slurm cannot run in a sandbox at {sb.root}: its configuration "
                           "cannot hold a path with spaces or such characters")
    state = cluster.read_state(sb.root)
    if state.slurm is not None:
        entry = state.slurm
        if list(entry.nodes) != names:
            raise SandboxError(f"Slurm already runs in the sandbox at {sb.root}, on "
                               f"{', '.join(entry.nodes)}; a sandbox runs one")
        dead = [r.name for group in entry.daemons for r in group if not daemons.alive(r)]
        if dead:
            raise SandboxError(f"Slurm in the sandbox at {sb.root} is broken: {', '.join(dead)} "
                               "stopped running; rebuild the sandbox")
        return _cluster(sb.root, entry)
    entry = state.slurm = SlurmState(
        nodes=tuple(names), netns=f"cr-{sb.prefix}-{CONTROLLER}",
        veth=net.veth_name(sb.prefix, 0), address=net.host_address(sb.subnet, 0),
        daemons=[[] for _ in DAEMONS])
    cluster.write_state(sb.root, state)  # first, so that down() finds whatever gets started
    try:
        _start(sb, state, entry)
    except BaseException as exc:
        leftovers = _undo(sb.root, state, entry)
        if not isinstance(exc, SandboxError):
            raise
        raise SandboxError(f"enable Slurm: {exc.message}{leftovers}") from exc
    return _cluster(sb.root, entry)


def load(sb: cluster.Sandbox) -> SlurmCluster:
    """The Slurm that enable() started in this sandbox (in this process or another)."""
    entry = cluster.read_state(sb.root).slurm
    if entry is None:
        raise SandboxError(f"Slurm is not enabled in the sandbox at {sb.root}")
    return _cluster(sb.root, entry)


def squeue(slurm: SlurmCluster, *, steps: bool = False) -> list[dict[str, str]]:
    """Jobs (id, state, nodes, name) or job steps (id as JOB.STEP, nodes, name) Slurm still
    has, running, pending or completing."""
    if steps:
        out = _client(slurm, ["squeue", "--noheader", "--steps", "--format=%i|%N|%j"])
        keys = ["id", "nodes", "name"]
    else:
        out = _client(slurm, ["squeue", "--noheader", "--format=%i|%T|%N|%j"])
        keys = ["id", "state", "nodes", "name"]
    return [dict(zip(keys, line.split("|", len(keys) - 1))) for line in out.splitlines()
            if line.strip()]


def scancel(slurm: SlurmCluster, job: str | int | None = None) -> None:
    """Cancel the job (every job when None): Slurm signals every process of its steps, on every
    node, and ends the salloc holding it."""
    ids = [str(job)] if job is not None else [j["id"] for j in squeue(slurm)]
    if ids:
        _client(slurm, ["scancel", *ids])


def wait_idle(slurm: SlurmCluster, timeout: float = READY_TIMEOUT) -> None:
    """Wait until Slurm has no job left and every node is idle (a cancelled job's nodes stay
    `completing` while its processes end, and a new allocation waits for them)."""
    _wait_until("wait for idle Slurm nodes", lambda: not squeue(slurm) and _all_idle(slurm),
                [], timeout, detail=lambda: _describe(slurm))


def pids(sb: cluster.Sandbox, host: str) -> list[int]:
    """Every process living in the host, except its sshd listener and slurmd: what jobs left."""
    entry = cluster.read_state(sb.root).slurm
    own = {r.pid for group in (entry.daemons if entry else []) for r in group
           if r.name == f"slurmd {host}"}
    return [pid for pid in cluster.pids(sb, host) if pid not in own]


# ---------------------------------------------------------------- starting


def _start(sb: cluster.Sandbox, state: SandboxState, entry: SlurmState) -> None:
    """Start Slurm's daemons, each recorded in entry, part of state, as it starts."""
    home = sb.root / DIR
    conf = home / "slurm.conf"
    netns, address = entry.netns, entry.address
    with net.step("write Slurm's configuration"):
        _write_files(sb, home, entry)
    net.ip_batch([f"netns add {netns}", *net.veth_lines(netns, entry.veth, "eth0", sb.bridge)],
                 step="create the Slurm controller's namespace")
    net.ip_batch(["link set lo up", f"addr add {address}/{sb.subnet.split('/')[1]} dev eth0",
                  "link set eth0 up"], step="configure the Slurm controller", netns=netns)
    inside = ["nsenter", f"--net={sshd.NETNS_DIR}/{netns}"]

    # --force: munged refuses a socket under a directory only root can enter (the sandbox
    # root), as it is useless to other users; the sandbox is root's alone anyway.
    munge = home / "munge"
    munged = _launch(sb.root, state, "munged", [
        *inside, _path("munged"), "--foreground", "--force", f"--socket={munge}/munge.socket",
        f"--key-file={munge}/munge.key", f"--pid-file={munge}/munged.pid",
        f"--seed-file={munge}/munged.seed", f"--log-file={munge}/munged.log"],
        home / "munged.out")
    _wait_until("start munged", (munge / "munge.socket").exists,
                [(munged, home / "munged.out")])

    # slurmctld serves only where its hostname is the one in SlurmctldHost.
    script = (f"printf %s {CONTROLLER} > /proc/sys/kernel/hostname && exec "
              f"{shlex.join([_path('slurmctld'), '-D', '-f', str(conf)])}")
    ctld = _launch(sb.root, state, "slurmctld",
                   [*inside, "unshare", "--uts", "sh", "-c", script], home / "slurmctld.out")
    _wait_until("start slurmctld", lambda: _accepts(address, PORT),
                [(ctld, home / "slurmctld.out"), (munged, home / "munged.out")])

    watched = [(ctld, home / "slurmctld.out")]
    for name in entry.nodes:
        host = sb.host(name)
        out = home / "nodes" / name / "slurmd.out"
        record = _launch(sb.root, state, f"slurmd {name}", [
            "nsenter", "-t", str(host.sshd_pid), "-m", "-u", "-n", "--", "sh", "-c",
            _slurmd_script(home, f"{state.view}/{DIR}", conf, name)], out)
        watched.append((record, out))
    slurm = _cluster(sb.root, entry)
    _wait_until("wait for the Slurm nodes", lambda: _all_idle(slurm), watched,
                detail=lambda: _describe(slurm))


def _slurmd_script(home: Path, view: str, conf: Path, node: str) -> str:
    """Run in the host's namespaces: slurmd, after making home visible there at its own path
    (the host's /tmp hides the machine's; its view of the sandbox root does not)."""
    lines = ["set -e"]
    if Path("/tmp") in home.parents:
        q = shlex.quote(str(home))
        # A retry after a failed enable finds the bind of a directory since removed: replace it.
        lines += [f"if mountpoint -q {q}; then umount -l {q}; fi", f"mkdir -p {q}",
                  f"mount --bind {shlex.quote(view)} {q}"]
    slurmd = [_path("slurmd"), "-D", "-f", str(conf), "-N", node]
    return "\n".join([*lines, f"exec {shlex.join(slurmd)}"])


def _write_files(sb: cluster.Sandbox, home: Path, entry: SlurmState) -> None:
    home.mkdir(mode=0o755, exist_ok=True)
    munge = home / "munge"
    munge.mkdir(mode=0o755, exist_ok=True)  # munged: "execute permissions for all required"
    sshd.write_private(munge / "munge.key", secrets.token_hex(64) + "\n")
    (home / "ctld").mkdir(exist_ok=True)
    for name in entry.nodes:
        (home / "nodes" / name).mkdir(parents=True, exist_ok=True)
    # More CPUs than the machine has would drain the nodes ("low socket*core*thread count").
    cpus = min(2, os.cpu_count() or 1)
    nodes = [f"NodeName={name} NodeAddr={sb.host(name).address} CPUs={cpus} RealMemory=1000 "
             "State=UNKNOWN" for name in entry.nodes]
    (home / "slurm.conf").write_text("\n".join([
        "# The Slurm of a clusterrun sandbox (tests/support/slurm.py); sandbox down ends it.",
        "ClusterName=sandbox",
        f"SlurmctldHost={CONTROLLER}({entry.address})",
        f"SlurmctldPort={PORT}",
        "SlurmUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={home}/munge/munge.socket",
        f"StateSaveLocation={home}/ctld",
        f"SlurmctldPidFile={home}/ctld/slurmctld.pid",
        f"SlurmdSpoolDir={home}/nodes/%n/spool",
        f"SlurmdPidFile={home}/nodes/%n/slurmd.pid",
        # slurmstepd logs here too: without a file, a step's errors would go to syslog.
        f"SlurmdLogFile={home}/nodes/%n/slurmd.log",
        "MailProg=/bin/true",
        "ReturnToService=2",  # a node whose slurmd registers again is usable again
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        # A step's processes are found by process tree, not by cgroup: slurmd leaves the
        # machine's cgroups alone (the hosts share them), and scancel still ends every process.
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "KillWait=5",  # seconds from a cancelled step's SIGTERM to its SIGKILL
        *nodes,
        "PartitionName=sandbox Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ""]))
    # slurmd 22.05 loads a cgroup plugin whatever the others are; v1's touches nothing until a
    # cgroup-based plugin asks, on any layout (v1, hybrid, v2 or no cgroupfs at all).
    (home / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")


def _launch(root: Path, state: SandboxState, name: str, argv: list[str],
            log: Path) -> DaemonRecord:
    assert state.slurm is not None  # enable() put it there
    record = daemons.start(name, argv, log)
    state.slurm.daemons[DAEMONS.index(name.split(maxsplit=1)[0])].append(record)
    cluster.write_state(root, state)
    return record


def _undo(root: Path, state: SandboxState, entry: SlurmState) -> str:
    """Remove what a failed enable() started (entry, part of state), so that it can be tried
    again."""
    errors = daemons.stop(entry.daemons)
    try:
        net.kill_netns_processes(entry.netns)
    except SandboxError as exc:
        errors.append(exc.message)
    net.delete_quietly(["ip", "netns", "delete", entry.netns], errors)
    if errors:
        return f" (cleanup also failed: {'; '.join(errors)}; run sandbox down on {root})"
    shutil.rmtree(root / DIR, ignore_errors=True)
    state.slurm = None
    cluster.write_state(root, state)
    return " (everything it had started was removed)"


def _wait_until(what: str, ready: Callable[[], bool],
                watched: Sequence[tuple[DaemonRecord, Path]],
                timeout: float = READY_TIMEOUT,
                detail: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for record, log in watched:
            if not daemons.alive(record):
                status = daemons.exit_status(record)
                ended = f"exited with status {status}" if status is not None else "is gone"
                raise SandboxError(f"{what}: {record.name} {ended}; {sshd.log_tail(log)}")
        if time.monotonic() > deadline:
            more = [detail()] if detail else []
            more += [sshd.log_tail(log) for _, log in watched[:1]]
            raise SandboxError(f"{what}: not done after {timeout:g} s; " + "; ".join(more))
        time.sleep(0.05)


# ---------------------------------------------------------------- clients and state


def _client(slurm: SlurmCluster, argv: list[str]) -> str:
    return net.run(argv, step=f"slurm {argv[0]}", timeout=CLIENT_TIMEOUT, env=slurm.env())


def _node_states(slurm: SlurmCluster) -> dict[str, str] | None:
    """Each node's state (idle, allocated, completing, down*...); None until slurmctld answers."""
    try:
        out = _client(slurm, ["sinfo", "--noheader", "--Node", "--format=%N %T"])
    except SandboxError:
        return None
    return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)


def _describe(slurm: SlurmCluster) -> str:
    states = _node_states(slurm)
    return "slurmctld does not answer sinfo" if states is None else "node states: " + ", ".join(
        f"{node} {state}" for node, state in states.items())


def _all_idle(slurm: SlurmCluster) -> bool:
    states = _node_states(slurm) or {}
    return all(states.get(name) == "idle" for name in slurm.nodes)


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found is None and os.access(f"{SBIN}/{name}", os.X_OK):
        found = f"{SBIN}/{name}"
    return found


def _path(name: str) -> str:
    return _tool(name) or name


def _cluster(root: Path, entry: SlurmState) -> SlurmCluster:
    return SlurmCluster(conf=root / DIR / "slurm.conf", nodes=entry.nodes,
                        controller_address=entry.address)
