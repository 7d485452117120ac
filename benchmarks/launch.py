"""A 4-host x 1-process gloo all-reduce: `clusterrun launch` next to parallel `ssh ... torchrun`
typed by hand (with each host's GLOO_SOCKET_IFNAME already known), plus the controller's memory
while streaming a lot of output.

    sudo .venv/bin/python benchmarks/launch.py [--hosts 4] [--repeat 3]

clusterrun's time includes what the hand-typed version skips: the preflight (data path
included), syncing and verifying the code, and verifying the log mirrors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, cluster, ssh_argv, table, timed

PAYLOAD = REPO / "clusterrun" / "smoke_payload" / "allreduce.py"
SPAM = REPO / "tests" / "payloads" / "spam.py"


def by_hand(sb, port: int) -> list[str]:
    """One ssh per host in parallel, the way users script it; returns the argv of a shell."""
    master = sb.hosts[0].address
    parts = []
    for rank, host in enumerate(sb.hosts):
        remote = (f"GLOO_SOCKET_IFNAME={host.ifname} {sys.executable} -m torch.distributed.run "
                  f"--nnodes {len(sb.hosts)} --node-rank {rank} --nproc-per-node 1 "
                  f"--master-addr {master} --master-port {port} {PAYLOAD}")
        parts.append(" ".join(ssh_argv(sb)) + f" {host.address} '{remote}' &")
    return ["sh", "-c", " ".join(parts) + " wait"]


def peak_rss_mb(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and the peak resident set of the largest process in the command's tree
    (measured by a fresh wrapper process, so earlier runs do not count)."""
    wrapper = ("import resource, subprocess, sys; "
               "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    start = time.perf_counter()
    cp = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True,
                        env=env, check=True)
    return time.perf_counter() - start, int(cp.stdout.split()[-1]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"clusterrun-bench-home-{os.getpid()}"
    env = dict(os.environ, CLUSTERRUN_HOME=str(home))
    with cluster(args.hosts) as sb:
        cli = [sys.executable, "-m", "clusterrun", "launch", "--nproc-per-node", "1",
               str(sb.inventory)]
        rows = []
        seconds, out = timed([*cli, str(PAYLOAD)], args.repeat, env=env)
        assert out.count("sum ") == args.hosts and "WRONG" not in out, out
        rows.append(("clusterrun launch", seconds, "check + sync + verify + launch"))
        seconds, out = timed(by_hand(sb, 29411), args.repeat)
        assert out.count("sum ") == args.hosts, out
        rows.append(("parallel ssh + torchrun by hand", seconds, "interfaces typed in"))
        # Memory: every rank prints 40,000 lines through the controller.
        wall, rss = peak_rss_mb([*cli[:-1], "--env", "LINES=40000", str(sb.inventory),
                                 str(SPAM)], env)
    print(f"{args.hosts} hosts x 1 process, gloo all-reduce, median of {args.repeat}, "
          f"{os.cpu_count()} CPUs")
    print(table(rows, "clusterrun launch"))
    print(f"\ncontroller streaming {args.hosts} x 40,000 lines ({args.hosts * 40000 * 70 / 1e6:.0f}"
          f" MB): {wall:.1f} s, peak RSS {rss:.0f} MB (the largest process: clusterrun itself)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
