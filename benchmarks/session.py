"""The warm session against today's direct path, clush and clush with OpenSSH ControlPersist.

    sudo .venv/bin/python benchmarks/session.py                       # 8, 32, 64 hosts, 3 rounds
    sudo .venv/bin/python benchmarks/session.py --sizes 8 --repeat 1 --rc plain   # quick
    sudo .venv/bin/python benchmarks/session.py --sizes 32 --rc plain --commands exec,check

On sandbox clusters of --sizes hosts, with a plain ~/.bashrc and with the conda-like one of
benchmarks/logins.py (--rc), each command (`exec -- hostname`, `check`, `stacks` and
`top --once` of a detached run of one idle rank per host, a 4-host x 1-rank gloo launch) is
measured in four states, in alternating rounds:

- cold: CLUSTERRUN_SESSION=1 with no daemon (`clusterrun session stop` first, untimed);
- warm: the same command again, once the daemon started behind the cold one holds its hosts
  (waited for, untimed: the cold command reaches its hosts directly and hands them over);
- expired: a daemon started with a short CLUSTERRUN_SESSION_IDLE (--expire-after), waited out
  until it has exited, then the command;
- off: CLUSTERRUN_SESSION=0, today's direct path;

next to `clush -f 64`, clush with ControlPersist (a private ControlPath, warmed by one untimed
call) and, for the launch, the hand-typed floor (one `ssh host torchrun` per host).

Columns: wall time; the controller's CPU: the command and its children, plus the daemon's (or
the ssh masters') CPU read from /proc/<pid>/stat before and after, since neither is a child of
the command; the hosts' CPU with every live process in each host counted (a resident agent is
reaped by nobody until the session ends; common.hosts_cpu_live); logins per host (the shells
sshd started for a channel: each host's ~/.bashrc records its parent, clusterrun/sandbox/sshd.py)
and the runs of ~/.bashrc per host (those, and the shells a command started that read it: bash
does for `exec`'s `$SHELL -c`, as it does for `ssh host command`). clusterrun runs as pip
installs it: byte-compiled first (common.compiled), with PYTHONDONTWRITEBYTECODE removed from its
environment. A checkout without `clusterrun session` gets the off rows and the baselines only.
Writes --out (Markdown) and the raw samples next to it (.json), with common.provenance.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import common
import launch
import logins
import report
import stall
from common import Sample, alternate, markdown_table, median, ssh_argv

from clusterrun import sandbox

IDLE = "import time\n\ntime.sleep(3600)\n"
COMMANDS = {"exec": "exec -- hostname", "check": "check", "stacks": "stacks",
            "top": "top --once", "launch": "launch 4x1 gloo"}
STATES = ("cold", "warm", "expired", "off")
CLUSH, CLUSH_CP, FLOOR = "clush -f 64", "clush -f 64 + ControlPersist", "parallel ssh + torchrun"
RC_KINDS = ("plain", "conda")
SETTLE = 0.2  # the per-connection sshds are reaped a moment after the command ends


def clusterrun_env(home: Path, runtime: Path) -> dict[str, str]:
    """What every clusterrun call here runs with: this checkout, a CLUSTERRUN_HOME and a
    runtime directory of its own (so the daemon and its socket are this benchmark's alone), and
    no PYTHONDONTWRITEBYTECODE (users run the .pyc pip wrote)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return dict(env, PYTHONPATH=str(common.REPO), CLUSTERRUN_HOME=str(home),
                XDG_RUNTIME_DIR=str(runtime))


def cli(env: dict[str, str], *args: str, timeout: float = 600) -> tuple[int, str, str]:
    cp = subprocess.run([sys.executable, "-m", "clusterrun", *args], capture_output=True,
                        text=True, env=env, check=False, timeout=timeout)
    return cp.returncode, cp.stdout, cp.stderr


def has_session(env: dict[str, str]) -> bool:
    return cli(env, "session", "--help", timeout=60)[0] == 0


@dataclass
class Resident:
    """The long-lived local processes a command uses but does not wait for (the session's
    daemon, OpenSSH's ControlPersist masters), read before and after the command, so that
    their CPU counts as the controller's. ``quiet`` finds them without asking them anything;
    ``ask`` (the daemon's own answer) is preferred when it gives pids, and is asked before the
    second reading is used, never between the readings it compares."""

    quiet: Callable[[], set[int]]
    ask: Optional[Callable[[], Optional[int]]] = None
    found_by: str = "command line"

    def pids(self) -> set[int]:
        pid = self.ask() if self.ask is not None else None
        if pid is not None:
            self.found_by = "clusterrun session --json"
            return {pid}
        return self.quiet()

    def before(self) -> dict[int, float]:
        return {pid: common.proc_cpu(pid) for pid in self.pids()}

    def used(self, before: dict[int, float]) -> float:
        early = {pid: common.proc_cpu(pid) for pid in self.quiet() | set(before)}
        return sum(early.get(pid, common.proc_cpu(pid)) - before.get(pid, 0.0)
                   for pid in self.pids())


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def local_processes(match: Callable[[str, bytes], bool]) -> set[int]:
    """This machine's processes outside every sandbox host (in this process's network
    namespace) whose command line ``match`` accepts, this process excluded."""
    here = os.readlink("/proc/self/ns/net")
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/net") == here and match(entry, _cmdline(entry)):
                found.add(int(entry))
    return found


def daemon(env: dict[str, str]) -> Resident:
    """The session's daemon: its pid from `clusterrun session --json` when that gives one,
    else every clusterrun process outside the hosts that carries this benchmark's own
    CLUSTERRUN_HOME in its environment (once a command has ended, only the daemon has)."""
    marker = f"CLUSTERRUN_HOME={env['CLUSTERRUN_HOME']}\0".encode()

    def ours(pid: str, cmdline: bytes) -> bool:
        if b"clusterrun" not in cmdline or cmdline.startswith(b"ssh"):
            return False
        try:
            return marker in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False

    def ask() -> Optional[int]:
        rc, out, _err = cli(env, "session", "--json", timeout=60)
        return _pid_in(out) if rc == 0 else None

    return Resident(lambda: local_processes(ours), ask)


def ssh_masters(control_dir: Path) -> Resident:
    """OpenSSH's ControlPersist masters for sockets in ``control_dir`` (each names its socket
    in its process title: `ssh: PATH [mux]`)."""
    prefix = b"ssh: " + str(control_dir).encode()
    return Resident(lambda: local_processes(lambda _pid, line: line.startswith(prefix)))


def _pid_in(text: str) -> Optional[int]:
    """The daemon's pid in `session --json`: ``pid``, ``daemon_pid`` or ``daemon.pid``."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    inner = doc.get("daemon")
    for value in (doc.get("pid"), doc.get("daemon_pid"),
                  inner.get("pid") if isinstance(inner, dict) else None):
        if isinstance(value, int) and value > 0:
            return value
    return None


def gone(pids: set[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@dataclass
class Bench:
    """One sandbox cluster and what every candidate on it shares."""

    sb: sandbox.Sandbox
    env: dict[str, str]
    folder: Path  # the scripts, seen by every host at the same path
    inv4: Path  # the first 4 hosts: the launch
    run_id: str = ""  # the detached run `stacks` and `top` look at
    background: frozenset[int] = frozenset()  # its processes on the hosts
    cp_dir: Path = Path()
    daemon: Optional[Resident] = None  # None: this checkout has no session
    masters: Optional[Resident] = None

    def on(self, **extra: str) -> dict[str, str]:
        return dict(self.env, CLUSTERRUN_SESSION="1", **extra)

    def off(self) -> dict[str, str]:
        return dict(self.env, CLUSTERRUN_SESSION="0")

    def measured(self, argv: list[str], env: Optional[dict[str, str]],
                 resident: Optional[Resident], check: Callable[[str], None]) -> Sample:
        """One timed run of ``argv`` with the CPU of ``resident`` processes, of every live
        process on the hosts, and the logins per host."""
        hosts = [h.name for h in self.sb.hosts]
        logins_before = [sandbox.logins(self.sb, h, from_sshd=True) for h in hosts]
        rc_before = [sandbox.logins(self.sb, h) for h in hosts]
        host_before = common.hosts_cpu_live(self.sb, self.background)
        local_before = resident.before() if resident else {}
        sample = common.measure(argv, env=env)
        time.sleep(SETTLE)
        local = resident.used(local_before) if resident else float("nan")  # "-": none
        sample.remote_cpu = common.hosts_cpu_live(self.sb, self.background) - host_before
        counts = [sandbox.logins(self.sb, h, from_sshd=True) - b
                  for h, b in zip(hosts, logins_before)]
        rc_runs = [sandbox.logins(self.sb, h) - b for h, b in zip(hosts, rc_before)]
        sample.extra.update(resident_cpu=local,
                            logins=float(max(counts)), logins_mean=sum(counts) / len(counts),
                            rc_runs=float(max(rc_runs)))
        sample.extra["controller_cpu"] = sample.cpu + (local if resident else 0.0)
        check(sample.stdout)
        return sample

    def clusterrun(self, command: str, env: dict[str, str]) -> Sample:
        n = len(self.sb.hosts)
        py = [sys.executable, "-m", "clusterrun"]
        inv = str(self.sb.inventory)
        argv, check = {
            "exec": ([*py, "exec", inv, "--", "hostname"], lines(n, "exec")),
            "check": ([*py, "check", "--json", inv], passed),
            "stacks": ([*py, "stacks", "--json", self.run_id], counted("ranks", n, "stacks")),
            "top": ([*py, "top", "--once", "--json", self.run_id], counted("hosts", n, "top")),
            "launch": ([*py, "launch", "--nproc-per-node", "1", str(self.inv4),
                        str(self.folder / "allreduce.py")], agreed(4, "launch")),
        }[command]
        return self.measured(argv, env, self.daemon, check)


def lines(n: int, what: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        got = [line for line in out.splitlines() if line.strip()]
        if len(got) != n:
            raise RuntimeError(f"{what}: {len(got)} lines from {n} hosts:\n{out[-500:]}")
    return check


def passed(out: str) -> None:
    if '"ok": true' not in out:
        raise RuntimeError(f"check did not pass: {out[-800:]}")


def counted(key: str, n: int, what: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        got = len(json.loads(out)[key])
        if got != n:
            raise RuntimeError(f"{what}: {got} {key} of {n}:\n{out[-500:]}")
    return check


def agreed(n: int, what: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        # ssh clients share one pipe, so lines may interleave: count words.
        if out.count("OK") != n or "WRONG" in out:
            raise RuntimeError(f"{what}: not every rank agreed:\n{out[-800:]}")
    return check


def candidates(b: Bench, expire_after: float,
               commands: Sequence[str] = tuple(COMMANDS)) -> dict[str, Callable[[], Sample]]:
    """Per command its states (cold, warm right after cold, expired, off; off alone without a
    session), then the baselines, in the order the rounds run them."""
    found: dict[str, Callable[[], Sample]] = {}
    for command, label in COMMANDS.items():
        if command not in commands:
            continue
        for state in STATES if b.daemon else ("off",):
            found[f"{label} | {state}"] = _state(b, command, state, expire_after)
    clush = shutil.which("clush") or shutil.which("clush", path=str(Path(sys.executable).parent))
    if clush is None:
        raise SystemExit("clush is not installed (pip install clustershell)")
    addrs = ",".join(h.address for h in b.sb.hosts)
    opts = " ".join(ssh_argv(b.sb)[1:])
    # clush reads -o through its configuration parser, where a literal % is written %%.
    persist = (f"{opts} -oControlMaster=auto -oControlPath={b.cp_dir}/%%C "
               "-oControlPersist=10m")
    every = lines(len(b.sb.hosts), "clush")
    found[CLUSH] = lambda: b.measured([clush, "-f", "64", "-o", opts, "-w", addrs, "hostname"],
                                      None, None, every)
    b.measured([clush, "-f", "64", "-o", persist, "-w", addrs, "hostname"], None, None, every)
    found[CLUSH_CP] = lambda: b.measured(
        [clush, "-f", "64", "-o", persist, "-w", addrs, "hostname"], None, b.masters, every)
    if "launch" in commands:
        found[FLOOR] = lambda: b.measured(floor_argv(b), None, None, agreed(4, FLOOR))
    return found


def _state(b: Bench, command: str, state: str, expire_after: float) -> Callable[[], Sample]:
    def run() -> Sample:
        if state == "off":
            return b.clusterrun(command, b.off())
        assert b.daemon is not None
        if state in ("cold", "expired"):
            stop_session(b)
        if state == "warm":
            holding(b, 4 if command == "launch" else len(b.sb.hosts))
        if state == "expired":
            short = b.on(CLUSTERRUN_SESSION_IDLE=f"{expire_after:g}")
            rc, _out, err = cli(short, "exec", str(b.sb.inventory), "--", "true")
            if rc != 0:
                raise RuntimeError(f"exec with the session on failed ({rc}): {err[-800:]}")
            pids = b.daemon.pids()
            if not pids:
                raise RuntimeError("exec with the session on left no daemon to expire")
            if not gone(pids, expire_after + 60):
                raise RuntimeError(f"the daemon {sorted(pids)} still runs {expire_after + 60:g} s "
                                   f"after its last command with CLUSTERRUN_SESSION_IDLE="
                                   f"{expire_after:g}")
        return b.clusterrun(command, b.on())
    return run


def holding(b: Bench, n: int, within: float = 120) -> None:
    """Wait until the daemon holds ``n`` hosts and connects no more (a checkout whose daemon
    does not say what it connects: until it holds ``n``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        rc, out, _err = cli(b.on(), "session", "--json", timeout=60)
        status = json.loads(out) if rc == 0 else {}
        alive = [h for h in status.get("hosts", []) if h.get("alive")]
        if len(alive) >= n and not status.get("connecting"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the daemon did not hold {n} hosts within {within:g} s")


def stop_session(b: Bench) -> None:
    """`clusterrun session stop`, and wait until the daemon has gone."""
    assert b.daemon is not None
    pids = b.daemon.pids()
    rc, _out, err = cli(b.on(), "session", "stop", timeout=60)
    if rc != 0:
        raise RuntimeError(f"clusterrun session stop failed ({rc}): {err[-800:]}")
    if not gone(pids, 30):
        raise RuntimeError(f"the daemon {sorted(pids)} still runs 30 s after session stop")


def floor_argv(b: Bench) -> list[str]:
    """What a user would type for the 4-host launch (benchmarks/launch.py's floor): one ssh +
    torchrun per host in parallel, each host's interface typed in."""
    hosts = b.sb.hosts[:4]
    port = 29000 + int(time.time() * 1000) % 900
    parts = []
    for rank, host in enumerate(hosts):
        remote = (f"GLOO_SOCKET_IFNAME={host.ifname} {sys.executable} -m "
                  f"torch.distributed.run --nnodes {len(hosts)} --node-rank {rank} "
                  f"--nproc-per-node 1 --master-addr {hosts[0].address} --master-port {port} "
                  f"{b.folder / 'allreduce.py'}")
        parts.append(" ".join(ssh_argv(b.sb)) + f" {host.address} '{remote}' &")
    return ["sh", "-c", " ".join(parts) + " wait"]


@contextlib.contextmanager
def bench(n: int, rc: str, with_session: bool, observed: bool = True) -> Iterator[Bench]:
    """``observed``: start the detached run that `stacks` and `top` look at."""
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(launch.payloads())
        (folder / "idle.py").write_text(IDLE)
        sb = stack.enter_context(logins.heavy_cluster(n) if rc == "conda" else common.cluster(n))
        runtime = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="crs-")))
        home = Path(launch.home_env(folder)["CLUSTERRUN_HOME"])
        b = Bench(sb, clusterrun_env(home, runtime), folder,
                  stall.inventory(sb, folder.parent / "inv4.yaml", 4),
                  cp_dir=Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cp-"))))
        b.masters = ssh_masters(b.cp_dir)
        if with_session:
            b.daemon = daemon(b.env)
        stack.callback(_clean_up, b)
        if observed:
            b.run_id = detached(b)
            _wait_for_ranks(b)
        b.background = frozenset(p for p, _h in common.host_processes(sb).items()
                                 if p not in {h.sshd_pid for h in sb.hosts})
        yield b


def detached(b: Bench) -> str:
    """A detached run of one idle rank per host, started on the direct path, for `stacks` and
    `top` to look at; its id."""
    rc, _out, err = cli(b.off(), "launch", "--detach", "--no-torchrun", "--nproc-per-node", "1",
                        "--grace", "2", "--stall-timeout", "0", str(b.sb.inventory),
                        str(b.folder / "idle.py"))
    match = re.search(r"run (\S+) started on", err)
    if rc != 0 or match is None:
        raise RuntimeError(f"the detached launch failed ({rc}): {err[-2000:]}")
    return match.group(1)


def _wait_for_ranks(b: Bench) -> None:
    n, deadline = len(b.sb.hosts), time.monotonic() + 120
    while time.monotonic() < deadline:
        rc, out, _err = cli(b.off(), "stacks", "--json", b.run_id, timeout=120)
        if rc == 0 and len(json.loads(out)["ranks"]) == n:
            return
        time.sleep(1)
    raise RuntimeError(f"the detached run {b.run_id} did not show {n} ranks within 120 s")


def _clean_up(b: Bench) -> None:
    """Stop the detached run, the daemon and the ssh masters this benchmark started."""
    if b.run_id:
        cli(b.off(), "stop", "--grace", "2", b.run_id, timeout=120)
    if b.daemon is not None:
        pids = b.daemon.pids()
        cli(b.on(), "session", "stop", timeout=60)
        left = pids if not gone(pids, 15) else set()
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    for pid in b.masters.pids() if b.masters else set():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def table(by_size: dict[int, dict[str, dict[str, list[Sample]]]]) -> str:
    rows = []
    for n, by_rc in sorted(by_size.items()):
        for rc, results in by_rc.items():
            clush, persist = median(results[CLUSH]), median(results[CLUSH_CP])
            for name, samples in results.items():
                wall = median(samples)
                command, _, state = name.partition(" | ")
                if command == COMMANDS["launch"]:
                    versus = [f"{wall / median(results[FLOOR]):.2f}x floor", "-"]
                elif name in (CLUSH, CLUSH_CP, FLOOR):
                    versus = ["-", "-"]
                else:
                    versus = [f"{wall / clush:.2f}x", f"{wall / persist:.2f}x"]
                rows.append([n, rc, command, state or "-", wall, *versus,
                             median(samples, "controller_cpu"), median(samples, "resident_cpu"),
                             median(samples, "remote_cpu"), f"{median(samples, 'logins'):g}",
                             f"{median(samples, 'rc_runs'):g}"])
    return markdown_table(["hosts", "~/.bashrc", "command", "session", "median s", "vs clush",
                           "vs clush + ControlPersist", "CPU here s", "of which daemon / ssh "
                           "masters s", "CPU on hosts s", "logins per host",
                           "~/.bashrc runs per host"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,64", help="host counts (default: 8,32,64)")
    parser.add_argument("--rc", default=",".join(RC_KINDS),
                        help="plain, conda (the conda-like ~/.bashrc of logins.py) or both "
                        "(default: plain,conda)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default: 3)")
    parser.add_argument("--commands", default=",".join(COMMANDS),
                        help=f"which of {', '.join(COMMANDS)} (default: all)")
    parser.add_argument("--expire-after", type=float, default=2.0,
                        help="CLUSTERRUN_SESSION_IDLE, seconds, for the expired rows (default: 2)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results-session.md",
                        help="the Markdown table (default: benchmarks/results-session.md); raw "
                        "samples go next to it as .json")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    kinds = [k.strip() for k in args.rc.split(",") if k.strip()]
    if set(kinds) - set(RC_KINDS):
        parser.error(f"--rc takes {' and '.join(RC_KINDS)}, not {args.rc}")
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    if not commands or set(commands) - set(COMMANDS):
        parser.error(f"--commands takes {', '.join(COMMANDS)}, not {args.commands}")
    common.compiled(common.REPO)  # as pip installs it: with .pyc, not compiled on each run
    prov = common.provenance()
    with tempfile.TemporaryDirectory() as tmp:
        with_session = has_session(clusterrun_env(Path(tmp), Path(tmp)))
    notes = [f"{args.repeat} alternating rounds; clusterrun byte-compiled (compileall) and run "
             "with PYTHONDONTWRITEBYTECODE unset"]
    if not with_session:
        skipped = ("session rows skipped: this checkout has no `clusterrun session` command "
                   "(`python -m clusterrun session --help` failed); measured the off rows "
                   "(CLUSTERRUN_SESSION=0) and the baselines only")
        print(skipped, flush=True)
        notes.append(skipped)
    by_size: dict[int, dict[str, dict[str, list[Sample]]]] = {}
    found_by = {}
    began = time.monotonic()
    for n in sizes:
        for rc in kinds:
            print(f"{n} hosts, {rc} ~/.bashrc: building the sandbox", flush=True)
            with bench(n, rc, with_session, bool({"stacks", "top"} & set(commands))) as b:
                found = candidates(b, args.expire_after, commands)
                by_size.setdefault(n, {})[rc] = alternate(found, args.repeat)
                if b.daemon is not None:
                    found_by["daemon"] = b.daemon.found_by
    if found_by:
        notes.append(f"the daemon's pid: from {found_by['daemon']}")
    notes.append(f"{time.monotonic() - began:.0f} s in all")
    common.finish(prov)
    section = ("The warm session: cold, warm, expired and off, next to clush", table(by_size))
    args.out.write_text(report.document(prov, [section], notes))
    common.write_json(args.out.with_suffix(".json"),
                      {"provenance": prov, "session_command": with_session,
                       "expire_after_s": args.expire_after, **found_by, "results": by_size})
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
