"""`clusterrun stacks` and the stall watchdog: what they cost.

1. `stacks` wall time on a run of one rank per host, at 8 and 32 hosts (median of --rounds).
2. The hosts' CPU for a run with and without the watchdog (--stall-timeout 0 vs 300), in
   alternating rounds (0, 300, 0, 300 ...; --rounds of each): every host's supervisor (and the
   py-spy it runs, reaped into its children's time) over a --window of seconds, on 8 hosts, for
   an idle silent rank and a busy silent one (the worst case: its stack is looked at every 10 s
   to tell computing from spinning in a collective).

No torch: the ranks are plain Python (--no-torchrun), so the numbers are clusterrun's own.
Writes benchmarks/stall.json (--out): the medians, every round's sample, the options used, and
the commit, machine and command (common.provenance).

    sudo .venv/bin/python benchmarks/stall.py --rounds 5 --window 30
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, TICK, cluster, finish, provenance  # puts the repository on sys.path

from clusterrun import sandbox

IDLE = "import time\n\n\ndef wait_here():\n    time.sleep(3600)\n\n\nwait_here()\n"
BUSY = ("import time\n\n\ndef compute():\n    while True:\n        sum(i * i for i in range(10000))"
        "\n\n\ncompute()\n")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterrun", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "CLUSTERRUN_HOME": str(home)},
                          check=False, timeout=600)


def start(home: Path, inv: Path, script: Path, *extra: str) -> str:
    cp = cli(home, "launch", "--detach", "--no-torchrun", "--nproc-per-node", "1", "--grace",
             "2", *extra, str(inv), str(script))
    match = re.search(r"run (\S+) started on", cp.stderr)
    if cp.returncode != 0 or not match:
        raise RuntimeError(cp.stderr[-2000:])
    return match.group(1)


def inventory(sb: sandbox.Sandbox, path: Path, n: int) -> Path:
    lines = sb.inventory.read_text().split("hosts:\n")
    hosts = lines[1].split("- host: ")[1:n + 1]
    path.write_text(lines[0] + "hosts:\n" + "".join("- host: " + h for h in hosts))
    return path


def time_stacks(home: Path, run_id: str, n: int, rounds: int) -> list[float]:
    out: list[float] = []
    while len(out) < rounds:
        began = time.perf_counter()
        cp = cli(home, "stacks", "--json", run_id)
        took = time.perf_counter() - began
        found = json.loads(cp.stdout)["ranks"] if cp.returncode == 0 else []
        if len(found) == n:
            out.append(took)
        else:
            time.sleep(1)  # the ranks are still starting
    return out


def supervisors(sb: sandbox.Sandbox, hosts: int) -> list[int]:
    found = []
    for host in sb.hosts[:hosts]:
        for pid in sandbox.pids(sb, host.name):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            # The daemon (detached) supervisor: a clusterrun program whose parent is init.
            if b"<clusterrun>" in cmdline and parent == 1:
                found.append(pid)
    return found


def cpu(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def host_cpu(home: Path, sb: sandbox.Sandbox, inv: Path, script: Path, *, hosts: int,
             timeout: str, window: float) -> float:
    run_id = start(home, inv, script, "--stall-timeout", timeout)
    time.sleep(8)  # started and settled
    pids = supervisors(sb, hosts)
    before = cpu(pids)
    time.sleep(window)
    used = cpu(pids) - before
    cli(home, "stop", "--grace", "2", run_id)
    return used / window / len(pids) * 100  # % of one core, per host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5,
                        help="stacks timings per size, and CPU samples per watchdog setting "
                        "(default: 5)")
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds each CPU sample lasts (default: 30)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "stall.json")
    args = parser.parse_args()
    prov = provenance()
    results: dict[str, object] = {"rounds": args.rounds, "window_s": args.window,
                                  "cpu_hosts": 8}
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="clusterrun-stall-") as tmp, cluster(32) as sb:
        home, folder = Path(tmp) / "home", Path(tmp) / "job"
        folder.mkdir()
        idle, busy = folder / "idle.py", folder / "busy.py"
        idle.write_text(IDLE)
        busy.write_text(BUSY)
        for n in (8, 32):
            inv = inventory(sb, Path(tmp) / f"inv{n}.yaml", n)
            run_id = start(home, inv, idle)
            times = time_stacks(home, run_id, n, args.rounds)
            cli(home, "stop", "--grace", "2", run_id)
            results[f"stacks_{n}_hosts_s"] = round(statistics.median(times), 2)
            samples[f"stacks_{n}_hosts_s"] = [round(t, 3) for t in times]
            print(f"stacks, {n} hosts: median {statistics.median(times):.2f} s "
                  f"(rounds {', '.join(f'{t:.2f}' for t in times)})", flush=True)
        inv = inventory(sb, Path(tmp) / "inv8.yaml", 8)
        # Alternating rounds (0, 300, 0, 300 ...): a machine getting busier or quieter during
        # the benchmark shifts both settings alike.
        for label, script in (("idle", idle), ("busy", busy)):
            for round_ in range(args.rounds):
                for timeout in ("0", "300"):
                    share = host_cpu(home, sb, inv, script, hosts=8, timeout=timeout,
                                     window=args.window)
                    key = f"supervisor_cpu_{label}_timeout_{timeout}_pct"
                    samples.setdefault(key, []).append(round(share, 3))
                    print(f"round {round_ + 1}/{args.rounds}: supervisor CPU per host, {label} "
                          f"silent rank, --stall-timeout {timeout}: {share:.3f} % of a core",
                          flush=True)
        for key, values in samples.items():
            if key.startswith("supervisor_cpu_"):
                results[key] = round(statistics.median(values), 3)
    results["samples"] = samples
    results["provenance"] = finish(prov)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k not in ("samples", "provenance")},
                     indent=2))


if __name__ == "__main__":
    main()
