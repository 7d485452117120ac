"""`hostname` on every host: clusterrun exec next to a serial ssh loop, pdsh and clush.

    sudo .venv/bin/python benchmarks/fanout.py [--hosts 32] [--repeat 3]

Builds its own sandbox cluster (Linux, root). Times are medians over --repeat runs on the same
machine in one go: compare the ratios, not absolute seconds across machines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from common import cluster, ssh_argv, table, timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with cluster(args.hosts) as sb:
        addrs = [h.address for h in sb.hosts]
        rows = []
        seconds, out = timed([sys.executable, "-m", "clusterrun", "exec", str(sb.inventory), "--",
                              "hostname"], args.repeat)
        assert out.count(": node") == args.hosts, out
        rows.append(("clusterrun exec (paramiko)", seconds, "prefixed, strict host keys"))
        loop = " ; ".join(" ".join(ssh_argv(sb)) + f" {a} hostname" for a in addrs)
        seconds, out = timed(["sh", "-c", loop], args.repeat)
        assert len(out.split()) == args.hosts
        rows.append(("serial ssh loop", seconds, "what users type"))
        if shutil.which("pdsh"):
            env = dict(os.environ, PDSH_RCMD_TYPE="ssh",
                       PDSH_SSH_ARGS=" ".join(ssh_argv(sb)[1:]) + " %h")
            seconds, out = timed(["pdsh", "-f", "64", "-w", ",".join(addrs), "hostname"],
                                 args.repeat, env=env)
            assert out.count("\n") == args.hosts
            rows.append(("pdsh -f 64 (OpenSSH)", seconds, ""))
        else:
            rows.append(("pdsh", float("nan"), "not installed"))
        if shutil.which("clush"):
            opts = " ".join(ssh_argv(sb)[1:])
            seconds, out = timed(["clush", "-f", "64", "-o", opts, "-w", ",".join(addrs),
                                  "hostname"], args.repeat)
            assert out.count("\n") == args.hosts
            rows.append(("clush -f 64 (OpenSSH)", seconds, ""))
        else:
            rows.append(("clush", float("nan"), "not installed"))
    print(f"hostname on {args.hosts} hosts, median of {args.repeat}, {os.cpu_count()} CPUs")
    print(table(rows, "clusterrun exec (paramiko)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
