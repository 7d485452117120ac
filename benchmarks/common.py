"""Shared by the benchmarks: a sandbox cluster to measure against, one measured run of a command
(wall time, CPU here and on the hosts, peak memory, threads), alternating repetitions, tables,
and what every results file records so that its figures can be traced and re-run (the commit,
the machine, the exact command)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from clusterrun import sandbox  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")

# What a measurement depends on: a change here outside the results files the benchmarks write
# themselves marks the results "dirty" (a change to the docs does not).
CODE = ("clusterrun", "benchmarks", "payloads", "pyproject.toml")
RESULTS = ("benchmarks/results", "benchmarks/stall.json", "benchmarks/top.json",
           "benchmarks/environments")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages: other work competing for the CPUs."""
    return [round(x, 2) for x in os.getloadavg()]


def provenance() -> dict[str, object]:
    """The commit the code was measured at (``dirty``: the code (``CODE``) differed from it,
    with the changed paths), the machine (CPUs, memory, kernel, Python, its load at the start)
    and the exact command, as every results file records them."""
    commit, changed = "unknown (not a git checkout)", ["?"]
    try:
        commit = _git("rev-parse", "--short", "HEAD").strip()
        status = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
        changed = [line[3:] for line in status.splitlines() if not line[3:].startswith(RESULTS)]
    except (OSError, subprocess.SubprocessError):
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024 ** 3
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(REPO)
    return {
        "commit": commit, "dirty": bool(changed), "changed": changed[:20],
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(["python", str(script), *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "memory_gb": round(mem_gb, 1),
                    "kernel": platform.release(), "python": platform.python_version(),
                    "load_average_at_start": load_average()},
    }


def provenance_lines(prov: dict[str, object]) -> list[str]:
    """``provenance()`` as the first lines of a Markdown results file."""
    machine = prov["machine"]
    assert isinstance(machine, dict)
    state = "with uncommitted changes to " + ", ".join(prov["changed"]) if prov["dirty"] \
        else "clean"  # type: ignore[arg-type]
    load = "Load average (1, 5, 15 min) at the start: " + ", ".join(
        f"{x:.2f}" for x in machine["load_average_at_start"])
    if "load_average_at_end" in machine:
        load += "; at the end: " + ", ".join(f"{x:.2f}" for x in machine["load_average_at_end"])
    return [f"Commit: `{prov['commit']}` ({state}), {prov['date']}",
            f"Command: `{prov['command']}`",
            f"Machine: {machine['cpus']} CPUs, {machine['memory_gb']:.0f} GB of memory, Linux "
            f"{machine['kernel']}, Python {machine['python']}; every sandbox host shares these "
            "CPUs with the controller.", load]


def finish(prov: dict[str, object]) -> dict[str, object]:
    """``prov`` with the load at the end of the run added."""
    machine = prov["machine"]
    assert isinstance(machine, dict)
    machine["load_average_at_end"] = load_average()
    return prov


def compiled(tree: Path) -> None:
    """Byte-compile a tree's package as pip does on install, so that neither side of a comparison
    pays for compiling from source on its first run."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "clusterrun")],
                   check=True)


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The repository at ``rev`` (a commit, tag or branch), compiled, in a temporary worktree:
    the clusterrun a change is measured against, side by side in the same rounds."""
    with tempfile.TemporaryDirectory(prefix="clusterrun-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--quiet", "--detach",
                        str(tree), rev], check=True)
        try:
            compiled(tree)
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                           check=False)


@contextlib.contextmanager
def cluster(n: int, rc_file: Optional[Path] = None) -> Iterator[sandbox.Sandbox]:
    with tempfile.TemporaryDirectory(prefix="clusterrun-bench-") as tmp:
        root = Path(tmp) / "sandbox"
        sb = sandbox.up(n, root, decoy=True, rc_file=rc_file)
        try:
            yield sb
        finally:
            sandbox.down(root)


def ssh_argv(sb: sandbox.Sandbox) -> list[str]:
    """OpenSSH with the sandbox's key and known_hosts, strict, as a user would configure it."""
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={sb.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-i", str(sb.identity_file), "-l", "root"]


def hosts_cpu(sb: sandbox.Sandbox) -> float:
    """CPU seconds spent so far on the hosts' side: every sshd listener's reaped children (the
    per-connection sshd and whatever it ran). Every sandbox host shares this machine's CPUs, so
    this is what the remote side of a command costs here."""
    total = 0
    for host in sb.hosts:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{host.sshd_pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[14]) + int(fields[15])
    return total / TICK


def proc_cpu(pid: int, *, own: bool = True) -> float:
    """CPU seconds of a live process: its own (``own``) and its reaped children's; 0.0 when it
    is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = int(fields[13]) + int(fields[14])  # cutime, cstime
    if own:
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / TICK


def _net_namespace(pid: int | str) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def host_processes(sb: sandbox.Sandbox) -> dict[int, str]:
    """Every process living in a sandbox host, listeners included: {pid: host name}. One pass
    over /proc (each host is a network namespace), not one `ip netns pids` per host."""
    spaces = {_net_namespace(h.sshd_pid): h.name for h in sb.hosts}
    spaces.pop(None, None)
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            host = spaces.get(_net_namespace(entry))
            if host is not None:
                found[int(entry)] = host
    return found


def hosts_cpu_live(sb: sandbox.Sandbox, background: frozenset[int] = frozenset()) -> float:
    """CPU seconds spent so far on the hosts' side, long-lived processes included: what
    ``hosts_cpu`` reads (the listeners' reaped children) plus every live process in a host (a
    resident agent, the sshd session above it, a ControlPersist master's session), which no
    listener has reaped yet. A process that ends between two readings moves from the second
    sum to the first, so the difference of two readings is what ran in between. For
    ``background`` pids (a run started before the measurement) only what they reaped counts,
    not their own steady work."""
    listeners = {h.sshd_pid for h in sb.hosts}
    total = 0.0
    for pid in host_processes(sb):
        if pid in listeners or pid in background:
            total += proc_cpu(pid, own=False)
        else:
            total += proc_cpu(pid)
    return total


@dataclass
class Sample:
    """One run of one command."""

    wall: float
    cpu: float  # the command and its local children (ssh clients, rsync...)
    remote_cpu: float = float("nan")  # the hosts' side (sshd and what it ran)
    peak_rss_mb: float = float("nan")  # the command's own process (its VmHWM)
    threads: int = 0  # the most threads the command's own process had at once
    stdout: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def measure(argv: Sequence[str], *, sb: Optional[sandbox.Sandbox] = None,
            env: Optional[dict[str, str]] = None, ok: Callable[[int], bool] = lambda rc: rc == 0,
            stdout: Optional[Path] = None) -> Sample:
    """Run ``argv`` once, its output kept in ``Sample.stdout``; or written to the file
    ``stdout`` (by the kernel: nothing here competes with the command for CPU), whose growth
    is sampled: ``extra["first_mb_at"]`` (seconds from the start when it passed 1 MB) and
    ``extra["last_growth_at"]``."""
    before = hosts_cpu(sb) if sb is not None else 0.0
    start = time.perf_counter()
    sink = open(stdout, "wb") if stdout is not None else subprocess.PIPE  # noqa: SIM115
    proc = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.PIPE, env=env)
    growth = {"first_mb_at": float("nan"), "last_growth_at": float("nan")}
    threads = [0]
    # VmHWM, not wait4's ru_maxrss: on Linux a child's ru_maxrss includes what its parent (this
    # benchmark) held when it was started.
    peak_kb = [0]
    done = threading.Event()

    def watch() -> None:  # the most threads the command had, and how its output grew
        status = Path(f"/proc/{proc.pid}/status")
        size = 0
        while not done.wait(0.02):
            if stdout is not None:
                now, grown = time.perf_counter() - start, stdout.stat().st_size
                if grown > size:
                    size = grown
                    growth["last_growth_at"] = now
                    if grown > 1e6 and math.isnan(growth["first_mb_at"]):
                        growth["first_mb_at"] = now
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in status.read_text().splitlines():
                    if line.startswith("Threads:"):
                        threads[0] = max(threads[0], int(line.split()[1]))
                    elif line.startswith("VmHWM:"):
                        peak_kb[0] = max(peak_kb[0], int(line.split()[1]))

    err: list[bytes] = []
    readers = [threading.Thread(target=watch, daemon=True),
               threading.Thread(target=lambda: err.append(proc.stderr.read()),  # type: ignore[union-attr]
                                daemon=True)]
    for t in readers:
        t.start()
    text = ""
    if proc.stdout is not None:
        text = proc.stdout.read().decode("utf-8", "replace")
    _pid, status, usage = os.wait4(proc.pid, 0)
    if stdout is not None:
        sink.close()  # type: ignore[union-attr]
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    for t in readers:
        t.join(5)
    if not ok(proc.returncode):
        tail = b"".join(err).decode("utf-8", "replace")[-800:]
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}): {tail}")
    remote = float("nan")
    if sb is not None:
        time.sleep(0.2)  # the per-connection sshds are reaped a moment after the command ends
        remote = hosts_cpu(sb) - before
    return Sample(wall, usage.ru_utime + usage.ru_stime, remote, peak_kb[0] / 1024,
                  threads[0], text, growth if stdout is not None else {})


def alternate(candidates: dict[str, Callable[[], Sample]], repeat: int,
              log: Callable[[str], None] = print) -> dict[str, list[Sample]]:
    """``repeat`` rounds of every candidate in turn (A B C A B C ...), so that a machine getting
    busier or quieter during the benchmark shifts every candidate alike."""
    results: dict[str, list[Sample]] = {name: [] for name in candidates}
    for round_ in range(repeat):
        for name, run in candidates.items():
            sample = run()
            results[name].append(sample)
            log(f"  round {round_ + 1}/{repeat} {name}: {sample.wall:.2f} s")
    return results


def median(samples: Sequence[Sample], attr: str = "wall") -> float:
    values = [getattr(s, attr) if attr in Sample.__dataclass_fields__ else s.extra[attr]
              for s in samples]
    return statistics.median(values)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: object) -> None:
    """The raw samples (without the commands' output)."""
    def plain(obj: object) -> object:
        return {k: v for k, v in vars(obj).items() if k != "stdout"}

    path.write_text(json.dumps(data, indent=1, default=plain))
