"""Benchmark 6: what a heavy shell setup on the hosts costs. sshd runs every command through the
user's login shell, and Debian's bash reads ~/.bashrc for it, so every SSH channel a command
opens pays that file on its host. The sandbox's hosts get an rc file that starts a Python on
every login, as a `conda init` block does (`sandbox up --rc-file`), and each command is
measured next to clush (exec, check) and the hand-typed floor (launch: one `ssh host python
script` per host in parallel). ``extra["logins"]`` is the most logins one host had during the
command (counted by each host's ~/.bashrc, see clusterrun/sandbox/sshd.py)."""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from common import Sample, alternate, cluster, measure, ssh_argv
from launch import payloads

from clusterrun import sandbox

# What `conda init` puts in ~/.bashrc, reduced to its cost: it runs conda's Python (with its
# site packages) on every login and evals what it prints.
HEAVY_RC = """\
# >>> conda initialize >>> (what it costs: one Python started per login)
__conda_setup="$('/usr/bin/python3' -c 'print("export CONDA_SHLVL=0")' 2> /dev/null)"
if [ $? -eq 0 ]; then
    eval "$__conda_setup"
fi
unset __conda_setup
# <<< conda initialize <<<
"""

EXEC = "clusterrun exec"
CLUSH = "clush -f 64"
CHECK = "clusterrun check"
LAUNCH = "clusterrun launch"
FLOOR = "parallel ssh + python"


@contextlib.contextmanager
def heavy_cluster(n: int) -> Iterator[sandbox.Sandbox]:
    with tempfile.TemporaryDirectory(prefix="clusterrun-bench-rc-") as tmp:
        rc = Path(tmp) / "bashrc"
        rc.write_text(HEAVY_RC)
        with cluster(n, rc_file=rc) as sb:
            yield sb


def _counted(sb: sandbox.Sandbox, run: Callable[[], Sample]) -> Callable[[], Sample]:
    """``run`` with the most logins one host had during it in ``extra["logins"]``."""
    def counted() -> Sample:
        before = {h.name: sandbox.logins(sb, h.name) for h in sb.hosts}
        sample = run()
        sample.extra["logins"] = float(max(sandbox.logins(sb, h.name) - before[h.name]
                                           for h in sb.hosts))
        return sample
    return counted


def candidates(sb: sandbox.Sandbox, folder: Path, env: dict[str, str]
               ) -> dict[str, Callable[[], Sample]]:
    n = len(sb.hosts)
    addrs = ",".join(h.address for h in sb.hosts)
    opts = " ".join(ssh_argv(sb)[1:])
    script = folder / "started.py"

    def lines(sample: Sample, what: str, pattern: str) -> Sample:
        got = len(re.findall(pattern, sample.stdout, re.M))
        if got != n:
            raise RuntimeError(f"{what}: {got} of {n} hosts answered:\n{sample.stdout[-500:]}")
        return sample

    def exec_() -> Sample:
        return lines(measure([sys.executable, "-m", "clusterrun", "exec", str(sb.inventory),
                              "--", "hostname"], sb=sb), EXEC, r"^\S+: node\d+$")

    def clush() -> Sample:
        return lines(measure(["clush", "-f", "64", "-o", opts, "-w", addrs, "hostname"], sb=sb),
                     CLUSH, r"^\S+: node\d+$")

    def check() -> Sample:
        sample = measure([sys.executable, "-m", "clusterrun", "check", "--json",
                          str(sb.inventory)], sb=sb, env=env)
        if '"ok": true' not in sample.stdout:
            raise RuntimeError(f"check did not pass: {sample.stdout[-800:]}")
        return sample

    def launch() -> Sample:
        return lines(measure([sys.executable, "-m", "clusterrun", "launch", "--no-torchrun",
                              "--nproc-per-node", "1", str(sb.inventory), str(script)],
                             sb=sb, env=env), LAUNCH, r"\] started \d+ ")

    def floor() -> Sample:
        # Hand-typed: each host's rank and world size, the script in place (/var/tmp is
        # shared by every sandbox host), no copy, no check.
        parts = [" ".join(ssh_argv(sb)) + f" {h.address} 'RANK={rank} WORLD_SIZE={n} "
                 f"{sys.executable} {script}' &" for rank, h in enumerate(sb.hosts)]
        return lines(measure(["sh", "-c", " ".join(parts) + " wait"], sb=sb), FLOOR,
                     r"^started \d+ ")

    runs = {EXEC: exec_, CLUSH: clush, CHECK: check, LAUNCH: launch, FLOOR: floor}
    return {name: _counted(sb, run) for name, run in runs.items()}


def run(sizes: list[int], repeat: int, env_for: Callable[[Path], dict[str, str]]
        ) -> dict[int, dict[str, list[Sample]]]:
    by_size = {}
    for n in sizes:
        print(f"{n} hosts with a heavy ~/.bashrc: building the sandbox", flush=True)
        with payloads() as folder, heavy_cluster(n) as sb:
            by_size[n] = alternate(candidates(sb, folder, env_for(folder)), repeat)
    return by_size
