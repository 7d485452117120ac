"""Shared by the benchmarks: a sandbox cluster to measure against, and a timer."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from clusterrun import sandbox  # noqa: E402


@contextlib.contextmanager
def cluster(n: int) -> Iterator[sandbox.Sandbox]:
    with tempfile.TemporaryDirectory(prefix="clusterrun-bench-") as tmp:
        root = Path(tmp) / "sandbox"
        sb = sandbox.up(n, root, decoy=True)
        try:
            yield sb
        finally:
            sandbox.down(root)


def ssh_argv(sb: sandbox.Sandbox) -> list[str]:
    """OpenSSH with the sandbox's key and known_hosts, strict, as a user would configure it."""
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={sb.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-i", str(sb.identity_file), "-l", "root"]


def timed(argv: Sequence[str], repeat: int, **kwargs: object) -> tuple[float, str]:
    """Median wall time of ``repeat`` runs, and the last run's stdout."""
    times, out = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        cp = subprocess.run(list(argv), capture_output=True, text=True, check=False,
                            **kwargs)  # type: ignore[call-overload]
        times.append(time.perf_counter() - start)
        if cp.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({cp.returncode}): {cp.stderr[-500:]}")
        out = cp.stdout
    return statistics.median(times), out


def table(rows: list[tuple[str, float, str]], baseline: str) -> str:
    base = next(t for name, t, _ in rows if name == baseline)
    lines = [f"{'tool':34} {'median s':>9} {'vs ' + baseline:>16}  notes"]
    for name, seconds, note in rows:
        lines.append(f"{name:34} {seconds:9.2f} {seconds / base:15.2f}x  {note}")
    return "\n".join(lines)
