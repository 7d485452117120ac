"""Benchmarks 1 and 2: `hostname` on every host with clusterrun exec, clush and pdsh (the same
OpenSSH settings: strict host keys, the sandbox's key), and a full `clusterrun check`, in
alternating rounds on one sandbox cluster per size."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable

from common import Sample, alternate, measure, ssh_argv

from clusterrun import sandbox

EXEC = "clusterrun exec"
CLUSH = "clush -f 64"
PDSH = "pdsh -f 64"
CHECK = "clusterrun check"


def candidates(sb: sandbox.Sandbox, with_check: bool) -> dict[str, Callable[[], Sample]]:
    n = len(sb.hosts)
    addrs = ",".join(h.address for h in sb.hosts)
    opts = " ".join(ssh_argv(sb)[1:])

    def lines_from_every_host(sample: Sample, what: str) -> Sample:
        got = [line for line in sample.stdout.splitlines() if line.strip()]
        if len(got) != n:
            raise RuntimeError(f"{what}: {len(got)} lines from {n} hosts:\n{sample.stdout[-500:]}")
        return sample

    def exec_() -> Sample:
        sample = measure([sys.executable, "-m", "clusterrun", "exec", str(sb.inventory), "--",
                          "hostname"], sb=sb)
        return lines_from_every_host(sample, EXEC)

    def clush() -> Sample:
        return lines_from_every_host(
            measure(["clush", "-f", "64", "-o", opts, "-w", addrs, "hostname"], sb=sb), CLUSH)

    def pdsh() -> Sample:
        env = dict(os.environ, PDSH_RCMD_TYPE="ssh", PDSH_SSH_ARGS=opts + " %h")
        return lines_from_every_host(
            measure(["pdsh", "-f", "64", "-w", addrs, "hostname"], sb=sb, env=env), PDSH)

    def check() -> Sample:
        sample = measure([sys.executable, "-m", "clusterrun", "check", "--json",
                          str(sb.inventory)], sb=sb)
        if '"ok": true' not in sample.stdout:
            raise RuntimeError(f"check did not pass: {sample.stdout[-800:]}")
        return sample

    found: dict[str, Callable[[], Sample]] = {EXEC: exec_}
    if shutil.which("clush"):
        found[CLUSH] = clush
    if shutil.which("pdsh"):
        found[PDSH] = pdsh
    if with_check:
        found[CHECK] = check
    return found


def run(sb: sandbox.Sandbox, repeat: int, with_check: bool) -> dict[str, list[Sample]]:
    return alternate(candidates(sb, with_check), repeat)
