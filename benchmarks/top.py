"""What `clusterrun top` costs the hosts: CPU per refresh on every host (its sampler and the
sshd session carrying it), the sampler's start and memory, and this machine's CPU per refresh,
on a sandbox of --hosts hosts running a detached run of one rank each that prints a line every
0.2 s (no torch: the run itself costs little, so the sampler's share is plain to see).

    sudo .venv/bin/python benchmarks/top.py --hosts 32 --refreshes 30 --interval 1

Writes benchmarks/top.json (--out) with the commit, machine and command (common.provenance).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, TICK, cluster, finish, provenance  # puts the repository on sys.path

from clusterrun import sandbox
from clusterrun.observe.frame import OK
from clusterrun.observe.watch import Watch
from clusterrun.runs import names
from clusterrun.transport import SshOptions

TICKER = """\
import os, time
rank = os.environ["RANK"]
step = 0
while True:
    step += 1
    print("step %d rank %s" % (step, rank), flush=True)
    time.sleep(0.2)
"""


def proc_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def samplers(sb: sandbox.Sandbox) -> dict[int, tuple[int, int]]:
    """Every host's sampler (a clusterrun program at nice 19) and the sshd session above it:
    {sampler pid: (its parent's pid, its RSS in KB)}."""
    found = {}
    for host in sb.hosts:
        for pid in sandbox.pids(sb, host.name):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                fields = proc_stat(pid)
            except OSError:
                continue
            if b"<clusterrun>" in cmdline and int(fields[16]) == 19:
                found[pid] = (int(fields[1]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE") // 1024)
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = proc_stat(pid)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def measure(sb: sandbox.Sandbox, home: Path, refreshes: int, interval: float) -> dict[str, float]:
    code = home / "code"
    code.mkdir()
    (code / "ticker.py").write_text(TICKER)
    env = dict(os.environ, CLUSTERRUN_HOME=str(home / "home"))
    cp = subprocess.run([sys.executable, "-m", "clusterrun", "launch", "--detach",
                         "--no-torchrun", "--nproc-per-node", "1", str(sb.inventory),
                         str(code / "ticker.py")], env=env, capture_output=True, text=True,
                        check=False, cwd=REPO)
    if cp.returncode != 0:
        raise SystemExit(f"launch failed:\n{cp.stderr}")
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    run = names.resolve(home / "home", run_id, note=lambda _t: None)
    watch = Watch(run, SshOptions(), interval)
    try:
        time.sleep(3)  # every rank has started printing
        began = time.monotonic()
        watch.start()
        watch.wait_connected(60)
        first = watch.refresh(wait=30)
        connected = time.monotonic() - began
        assert all(h.status == OK for h in first.hosts), [h for h in first.hosts if h.status != OK]
        found = samplers(sb)
        pids = list(found) + [parent for parent, _ in found.values()]
        start_cpu = cpu_seconds(list(found))
        host_before, here_before = cpu_seconds(pids), time.process_time()
        waits = []
        for _ in range(refreshes):
            t = time.monotonic()
            frame = watch.refresh()
            waits.append(time.monotonic() - t)
            assert all(h.status == OK for h in frame.hosts)
            time.sleep(max(0.0, interval - waits[-1]))
        host_cpu, here_cpu = cpu_seconds(pids) - host_before, time.process_time() - here_before
    finally:
        watch.close()
        subprocess.run([sys.executable, "-m", "clusterrun", "stop", "--grace", "2", run_id],
                       env=env, capture_output=True, check=False, cwd=REPO)
    n = len(sb.hosts)
    return {"hosts": n, "refreshes": refreshes, "interval_s": interval,
            "samplers": len(found), "connect_and_first_sample_s": round(connected, 2),
            "sampler_start_cpu_ms_per_host": round(1000 * start_cpu / max(1, len(found)), 1),
            "host_cpu_ms_per_refresh_per_host": round(1000 * host_cpu / refreshes / n, 2),
            "host_cpu_percent_per_host": round(100 * host_cpu / n / (refreshes * interval), 3),
            "sampler_rss_mb": round(max(r for _, r in found.values()) / 1024, 1),
            "controller_cpu_ms_per_refresh": round(1000 * here_cpu / refreshes, 1),
            "answers_within_s_median": round(sorted(waits)[len(waits) // 2], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--refreshes", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "top.json")
    args = parser.parse_args()
    prov = provenance()
    with tempfile.TemporaryDirectory(prefix="clusterrun-top-", dir="/var/tmp") as tmp, \
            cluster(args.hosts) as sb:
        result = measure(sb, Path(tmp), args.refreshes, args.interval)
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps({**result, "provenance": finish(prov)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
