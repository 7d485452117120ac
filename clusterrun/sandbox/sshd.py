"""One sandbox host's files, keys and sshd (see clusterrun.sandbox)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterrun.errors import SandboxError
from clusterrun.sandbox import net
from clusterrun.sandbox.state import SandboxHost

SSHD = "/usr/sbin/sshd"
# sshd runs an AuthorizedKeysCommand only from a root-owned path none but root may write.
CAT = "/usr/bin/cat"
KEY = "ssh_host_ed25519_key"
LOGINS = "logins"  # in a host's directory: one line per run of its ~/.bashrc (see bashrc)
_SSHD = ([b"sshd"], [b"sshd-session"])  # a shell's parent when sshd started it (the comm)
# In a host's directory: sshd's configuration file, empty but for what an add-on puts there
# (tests/support/docker.py's SetEnv); the command line's options come first and win. A restart
# rereads it.
CONFIG = "sshd_config"
READY_TIMEOUT = 30.0
SETTLE_TIMEOUT = 3.0
NETNS_DIR = "/run/netns"  # where `ip netns add` pins each namespace
CRUN_STATE = "containers/crun"  # in a host's directory; bound over /run/crun inside the host
# What an SSH session on a host gets, not this process's environment: CONTAINERS_CONF, TMPDIR
# or XDG_* here would point podman at the machine's state instead of the host's.
SESSION_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "USER": "root", "LOGNAME": "root", "LANG": "C.UTF-8"}

# sshd runs as our child; keeping the Popen (by namespace) lets down() reap it, not leave a zombie.
_children: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}


def keygen(path: Path, comment: str) -> None:
    net.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            step=f"generate key {path}")


def write_host_files(root: Path, view: str, host: SandboxHost, hosts: Sequence[SandboxHost],
                     rc_text: str = "") -> None:
    home = root / host.name
    home.mkdir(mode=0o700)
    (home / "tmp").mkdir()
    (home / "tmp").chmod(0o1777)
    names = "".join(f"{h.address} {h.name}\n" for h in hosts)
    (home / "hosts").write_text("127.0.0.1 localhost\n" + names)
    # No nameserver: this machine's resolver is unreachable from the namespaces, and every
    # lookup would wait 10-20 s for it; names come from the hosts file, as on a real cluster.
    (home / "resolv.conf").write_text("options timeout:1 attempts:1\n")
    (home / "bashrc").write_text(bashrc(f"{view}/{host.name}/{LOGINS}", rc_text))
    keygen(home / KEY, f"{host.name}@clusterrun-sandbox")


def bashrc(logins: str, rc_text: str = "") -> str:
    """A host's ~/.bashrc: one line per login appended to ``logins`` (a path as the host sees
    it), then ``rc_text`` (`sandbox up --rc-file`), else nothing.

    sshd runs every command through the user's shell, and Debian's bash reads ~/.bashrc for
    it: a host sharing this machine's (pyenv rehash, conda init: slow or locking work) would
    pay for it on every SSH channel. The count comes first, before any interactive guard
    that returns, so that every login is counted, and costs no process (builtins only).
    """
    # Each line: the shell's pid and its parent's name, read with builtins: a shell that
    # sshd started for a channel (a login) says sshd or sshd-session; one that a command
    # started (`exec`'s $SHELL -c, which bash also gives ~/.bashrc) names that command.
    head = ("# the shell setup of a clusterrun sandbox host (clusterrun/sandbox/sshd.py)\n"
            "__clusterrun_parent=; read -r __clusterrun_parent < /proc/$PPID/comm 2>/dev/null\n"
            f"echo \"$$ $__clusterrun_parent\" >> {shlex.quote(logins)} 2>/dev/null\n"
            "unset __clusterrun_parent\n")
    if not rc_text:
        return head
    return head + "# --- the rc file given to `clusterrun sandbox up --rc-file` ---\n" + rc_text


def rc_text(rc_file: Path | None) -> str:
    """The text of ``rc_file``, checked before anything is built."""
    if rc_file is None:
        return ""
    if bind_target(root_bashrc()) is None:
        raise SandboxError(
            f"--rc-file needs a {root_bashrc()} on this machine to cover in each host "
            "(a file can only be mounted over a file): create an empty one "
            f"(`touch {root_bashrc()}`) and try again.")
    try:
        return Path(rc_file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SandboxError(f"cannot read the rc file {rc_file}: {exc}") from None


def logins(home: Path, *, from_sshd: bool = False) -> int:
    """How many times the host's ~/.bashrc ran (see bashrc): for each SSH channel that ran a
    command, and for each shell a command started that reads it too (bash does, for
    `exec`'s). ``from_sshd``: only the shells sshd started, the logins proper."""
    if bind_target(root_bashrc()) is None:
        raise SandboxError(f"logins are counted by each host's ~/.bashrc, mounted over "
                           f"{root_bashrc()}, which this machine lacks: create an empty one "
                           "and rebuild the sandbox.")
    try:
        with open(home / LOGINS, "rb") as handle:
            if from_sshd:
                return sum(1 for line in handle if line.split()[1:2] in _SSHD)
            return sum(block.count(b"\n") for block in iter(lambda: handle.read(65536), b""))
    except FileNotFoundError:
        return 0


def root_bashrc() -> str:
    """The ~/.bashrc of root, whom the sandbox's sessions log in as (not of whoever ran sudo)."""
    return os.path.join(pwd.getpwuid(0).pw_dir, ".bashrc")


def bind_target(path: str) -> str | None:
    """Where a bind over `path` must go; None when there is nothing to cover.

    /etc/resolv.conf is often a symlink (systemd-resolved); mount follows it, so bind over
    its target. A missing resolv.conf needs no cover: glibc then asks 127.0.0.1, which fails
    at once inside the namespace.
    """
    real = os.path.realpath(path)
    return real if os.path.isfile(real) else None


def shared_under_tmp(python: str) -> list[str]:
    """What of the controller's Python lives under /tmp (a venv in a checkout there, say): the
    hosts' own /tmp would hide it, but they share this machine's filesystem for everything else,
    so it is mounted back at the same path."""
    candidates = {os.path.dirname(os.path.dirname(os.path.abspath(python))),
                  os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    return sorted(p for p in candidates if p.startswith("/tmp/"))


# Where a host sees the machine's cgroup2 hierarchy on a hybrid v1/v2 machine (sys_lines).
CGROUP2_BESIDE = "/run/clusterrun-sandbox-cgroup2"


def sys_lines(scratch: str) -> list[str]:
    """Commands giving the host a /sys of its own network namespace, with the cgroups.

    A sysfs shows the network devices of the namespace that mounts it. Container runtimes
    (crun) refuse to start without /sys/fs/cgroup, and crun 1.8 refuses a hybrid v1/v2 layout,
    so the cgroup2 mount of such a machine is left out of the host's view (only the host's).
    `scratch` is an empty directory; the new sysfs is built there and then moved over /sys.
    """
    q = shlex.quote
    lines = [f"mount -t sysfs sysfs {q(scratch)}"]
    if os.path.ismount("/sys/fs/cgroup"):
        lines.append(f"mount --rbind /sys/fs/cgroup {q(scratch + '/fs/cgroup')}")
        if _hybrid_cgroups():
            # The cgroup2 hierarchy stays reachable beside it, where crun does not look, so
            # the supervisor can give each job a cgroup as on a real host.
            os.makedirs(CGROUP2_BESIDE, exist_ok=True)
            lines += [f"umount {q(scratch + '/fs/cgroup/unified')}",
                      f"mount -t cgroup2 cgroup2 {q(CGROUP2_BESIDE)}"]
    if os.path.ismount("/sys"):  # the machine's, hidden under the new one, would still be listed
        lines.append("umount --lazy /sys")
    return [*lines, f"mount --move {q(scratch)} /sys"]


def _hybrid_cgroups() -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(m.split()[1:3] == ["/sys/fs/cgroup/unified", "cgroup2"] for m in mounts)


def start(root: Path, view: str, host: SandboxHost,
          shared: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start the host's sshd in its namespace, with its own hostname and mounts."""
    # sshd reads its files through a view of root under /run, because root may itself lie
    # under /tmp, which the host's own /tmp covers.
    home = f"{view}/{host.name}"
    options = {
        "UsePAM": "no", "StrictModes": "no", "PidFile": f"{home}/sshd.pid",
        "HostKey": f"{home}/{KEY}", "ListenAddress": host.address, "Port": "22",
        # The sandbox's key for every user, read by root: a user needs no home of its own
        # (a test's user may have none) and the sandbox's folder stays closed to others.
        "AuthorizedKeysCommand": f"{CAT} {view}/authorized_keys",
        "AuthorizedKeysCommandUser": "root",
        "AuthorizedKeysFile": ".ssh/authorized_keys",
        "PermitRootLogin": "prohibit-password", "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no", "MaxStartups": "200", "MaxSessions": "200",
        "Subsystem": "sftp internal-sftp",
    }
    (root / host.name / CONFIG).touch()  # a file of its own drops the packaged sftp line
    sshd = [SSHD, "-D", "-e", "-f", f"{home}/{CONFIG}"]
    for key, value in options.items():
        sshd += ["-o", f"{key}={value}"]
    hosts_target = bind_target("/etc/hosts")
    if hosts_target is None:
        raise SandboxError("/etc/hosts is missing on this machine; create it (any content)")
    q = shlex.quote
    script = [
        "set -e",
        *sys_lines(view),
        f"printf %s {q(host.name)} > /proc/sys/kernel/hostname",
        f"mount --bind {q(str(root))} {q(view)}",
        f"mount --bind {q(home + '/hosts')} {q(hosts_target)}",
    ]
    resolv_target = bind_target("/etc/resolv.conf")
    if resolv_target is not None:
        script.append(f"mount --bind {q(home + '/resolv.conf')} {q(resolv_target)}")
    rc_target = bind_target(root_bashrc())
    if rc_target is not None:
        script.append(f"mount --bind {q(home + '/bashrc')} {q(rc_target)}")
    for path in shared:  # bound into the host's /tmp first, then carried along by --rbind
        inside = f"{home}/tmp/{os.path.relpath(path, '/tmp')}"
        (root / host.name / "tmp" / os.path.relpath(path, "/tmp")).mkdir(parents=True,
                                                                       exist_ok=True)
        script.append(f"mount --bind {q(path)} {q(inside)}")
    script += [f"mount --rbind {q(home + '/tmp')} /tmp", f"exec {shlex.join(sshd)}"]
    # Not `ip netns exec`: its own remount of /sys drops /sys/fs/cgroup (see sys_lines).
    argv = ["nsenter", f"--net={NETNS_DIR}/{host.netns}", "unshare", "--uts", "--mount",
            "--propagation", "private", "sh", "-c", "\n".join(script)]
    # A crashed sshd (faults.crash) leaves its pid file: wait_ready must not take that pid for
    # the new listener's, or everything "but the listener" would include the new one.
    (root / host.name / "sshd.pid").unlink(missing_ok=True)
    with open(root / host.name / "sshd.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)  # outlives `sandbox up`, no tty signals
    _children[proc.pid] = (host.netns, proc)
    return proc


def wait_ready(root: Path, hosts: Sequence[SandboxHost],
               procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, int]:
    """Poll until every sshd has written its pid and accepts TCP; return the pids by host."""
    deadline = time.monotonic() + READY_TIMEOUT
    pending = {h.name: h for h in hosts}
    pids: dict[str, int] = {}
    while pending:
        for name, host in list(pending.items()):
            code = procs[name].poll()
            if code is not None:
                raise SandboxError(f"start sshd on {name}: it exited with status {code}; "
                                   f"{log_tail(root / name / 'sshd.log')}")
            pid = _read_pid(root / name / "sshd.pid")
            if pid and accepts(host.address):
                pids[name] = pid
                del pending[name]
        if pending and time.monotonic() > deadline:
            first = next(iter(pending))
            raise SandboxError(
                f"wait for sshd: {', '.join(pending)} not accepting connections on port 22 "
                f"after {READY_TIMEOUT:g} s; {first}: {log_tail(root / first / 'sshd.log')}")
        if pending:
            time.sleep(0.02)
    settle([(h.netns, pids[h.name]) for h in hosts])
    return pids


def settle(listeners: list[tuple[str, int]]) -> None:
    """Wait (briefly, best effort) until each namespace holds only its sshd listener.

    Each readiness probe makes sshd fork a pre-auth child that lives for tens of
    milliseconds; callers checking a host for stray processes must not see it.
    """
    deadline = time.monotonic() + SETTLE_TIMEOUT
    pending = list(listeners)
    while pending and time.monotonic() < deadline:
        pending = [(ns, pid) for ns, pid in pending if set(net.netns_pids(ns)) - {pid}]
        if pending:
            time.sleep(0.01)


def restart(home: Path, netns: str, pid: int, address: str) -> None:
    """SIGHUP: sshd re-executes itself in place, same pid and namespaces, rereading its key."""
    log = home / "sshd.log"
    if pid not in net.netns_pids(netns):
        raise SandboxError(f"sshd of {home.name} (pid {pid}) is not running; rebuild the sandbox")
    before = _listening_count(log)
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + READY_TIMEOUT
    while not (_listening_count(log) > before and accepts(address)):
        if time.monotonic() > deadline or pid not in net.netns_pids(netns):
            raise SandboxError(f"restart sshd on {home.name} failed; {log_tail(log)}")
        time.sleep(0.02)
    settle([(netns, pid)])


def reap_children(killed_netns: set[str]) -> None:
    """Collect exit statuses: of the sshds just killed in killed_netns, and of any that ended."""
    for pid, (netns, proc) in list(_children.items()):
        if netns in killed_netns:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        if proc.poll() is not None:
            del _children[pid]


def session_run(sshd_pid: int, host: str, argv: Sequence[str], *, timeout: float, check: bool,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv on the host as an SSH session there would: in the namespaces of its sshd
    (``sshd_pid``), with a session's environment plus ``env``. Running past ``timeout``, or
    (with ``check``) failing, is a SandboxError naming the command and the host."""
    cmd = ["nsenter", "-t", str(sshd_pid), "-m", "-u", "-n", "--", *argv]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                            env={**SESSION_ENV, **(env or {})}, check=False)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{shlex.join(argv)}` on {host} did not finish within "
                           f"{timeout:g} s") from None
    if check and cp.returncode != 0:
        detail = (cp.stderr or cp.stdout).strip() or "(no output)"
        raise SandboxError(f"`{shlex.join(argv)}` on {host} failed with exit status "
                           f"{cp.returncode}: {detail}")
    return cp


def remove_containers(root: Path, hosts: Sequence[SandboxHost]) -> None:
    """Remove the containers of these hosts (tests/support/containers.py gives them podman);
    down() calls it before it kills the hosts' processes.

    Killing a host's processes stops only the containers inside its network namespace: one on
    a network of its own would run on. podman removes them while the host lives; crun's state
    (each container's init, by pid and start time) finds what podman could not, such as the
    containers of a host whose processes were all killed, and those get SIGKILL.
    """
    live = [h for h in hosts if _container_inits(root / h.name / CRUN_STATE)]

    def podman_rm(host: SandboxHost) -> None:
        with contextlib.suppress(SandboxError):  # best effort
            if host.sshd_pid in net.netns_pids(host.netns):
                session_run(host.sshd_pid, host.name,
                            ["podman", "rm", "--all", "--force", "--time", "0"], timeout=60,
                            check=False)

    net.parallel(podman_rm, live)
    for host in live:
        for pid in _container_inits(root / host.name / CRUN_STATE):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # init of its pid namespace: all of it goes


def _container_inits(state_dir: Path) -> list[int]:
    found = []
    for status in state_dir.glob("*/status"):
        try:
            state = json.loads(status.read_text())
            pid, started = int(state["pid"]), int(state["process-start-time"])
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone, or never started
        if int(stat.rsplit(")", 1)[1].split()[19]) == started:  # not a reused pid
            found.append(pid)
    return found


def accepts(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5):
            return True
    except OSError:
        return False


def pubkey(path: Path) -> str:
    """`TYPE BASE64` of an OpenSSH public key file, without its comment."""
    return " ".join(path.read_text().split()[:2])


def write_private(path: Path, text: str) -> None:
    """Write atomically, mode 0600: readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def log_tail(log: Path, lines: int = 5) -> str:
    try:
        tail = log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        tail = []
    return f"its log {log} ends: " + " | ".join(tail) if tail else f"its log {log} is empty"


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _listening_count(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count("Server listening on")
    except OSError:
        return 0
