"""Benchmarks 3, 4 and 5: `clusterrun launch` end to end against the floor (one `ssh host
torchrun ...` per host in parallel, each host's interface typed in); the start of a payload that
does not import torch on many hosts (controller CPU, threads, peak memory); and the console and
mirror throughput of 4 hosts x 2 ranks printing as fast as they can, every line counted."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

from common import Sample, alternate, measure, ssh_argv

from clusterrun import sandbox

ALLREDUCE = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
w = dist.get_world_size()
print("sum", int(t.item()), "OK" if t.item() == w * (w + 1) / 2 else "WRONG", flush=True)
dist.destroy_process_group()
"""
# Prints its start time by this machine's clock (every sandbox host shares it).
STARTED = """\
import os, time
print("started", os.environ["RANK"], repr(time.time()), flush=True)
"""
# LINES lines of exactly WIDTH bytes, numbered, as fast as the rank can write them.
SPAM = """\
import os, sys
rank, lines, width = int(os.environ["RANK"]), int(os.environ["LINES"]), int(os.environ["WIDTH"])
out = sys.stdout
pad = "x" * (width - 16)  # "s000 000000000 " and the newline
for i in range(lines):
    out.write("s%03d %09d %s\\n" % (rank, i, pad))
out.flush()
"""
SPAM_LINE = re.compile(r"s(\d{3}) (\d{9}) x+$")


@contextlib.contextmanager
def payloads() -> Iterator[Path]:
    """The scripts, in a folder every sandbox host sees at the same path (/tmp is private to
    each host; /var/tmp is shared)."""
    base = Path(tempfile.mkdtemp(prefix="clusterrun-bench-", dir="/var/tmp"))
    folder = base / "code"  # what a launch copies to the hosts; CLUSTERRUN_HOMEs beside it
    try:
        folder.mkdir()
        (base / "homes").mkdir()
        for name, text in (("allreduce.py", ALLREDUCE), ("started.py", STARTED),
                           ("spam.py", SPAM)):
            (folder / name).write_text(text)
        yield folder
    finally:
        shutil.rmtree(base, ignore_errors=True)


def home_env(folder: Path) -> dict[str, str]:
    """A CLUSTERRUN_HOME of its own (runs, mirrors), removed with the payload folder."""
    home = tempfile.mkdtemp(prefix="home-", dir=folder.parent / "homes")
    return dict(os.environ, CLUSTERRUN_HOME=home)


def _cli(sb: sandbox.Sandbox, *options: str) -> list[str]:
    return [sys.executable, "-m", "clusterrun", "launch", *options, str(sb.inventory)]


def _on(tree: Optional[Path], env: dict[str, str]) -> dict[str, str]:
    """``env`` running the clusterrun of ``tree`` (a baseline checkout), or this one's."""
    return env if tree is None else dict(env, PYTHONPATH=str(tree))


def named(baseline: Optional[tuple[str, Path]]) -> dict[str, Optional[Path]]:
    """The clusterruns to measure: this checkout's, and the baseline's (--baseline REV)."""
    trees: dict[str, Optional[Path]] = {"clusterrun launch": None}
    if baseline is not None:
        trees[f"clusterrun launch at {baseline[0]}"] = baseline[1]
    return trees


def end_to_end(sb: sandbox.Sandbox, folder: Path, repeat: int,
               trees: dict[str, Optional[Path]]) -> dict[str, list[Sample]]:
    """Benchmark 3: a 1-process-per-host gloo all-reduce, by each of ``trees`` (see ``named``)
    and by hand."""
    n, env = len(sb.hosts), home_env(folder)
    script = folder / "allreduce.py"
    master = sb.hosts[0].address

    def ok(sample: Sample, what: str) -> Sample:
        # Four ssh clients share one pipe: their lines may interleave, so count words.
        if sample.stdout.count("OK") != n or "WRONG" in sample.stdout:
            raise RuntimeError(f"{what}: not every rank agreed:\n{sample.stdout[-800:]}")
        return sample

    def clusterrun(tree: Optional[Path]) -> Callable[[], Sample]:
        return lambda: ok(measure([*_cli(sb, "--nproc-per-node", "1"), str(script)], sb=sb,
                                  env=_on(tree, env)), "clusterrun launch")

    def by_hand() -> Sample:
        port = 29000 + int(time.time() * 1000) % 900
        parts = []
        for rank, host in enumerate(sb.hosts):
            remote = (f"GLOO_SOCKET_IFNAME={host.ifname} {sys.executable} -m "
                      f"torch.distributed.run --nnodes {n} --node-rank {rank} --nproc-per-node 1 "
                      f"--master-addr {master} --master-port {port} {script}")
            parts.append(" ".join(ssh_argv(sb)) + f" {host.address} '{remote}' &")
        return ok(measure(["sh", "-c", " ".join(parts) + " wait"], sb=sb), "ssh + torchrun")

    candidates = {name: clusterrun(tree) for name, tree in trees.items()}
    return alternate({**candidates, "parallel ssh + torchrun": by_hand}, repeat)


def start(sb: sandbox.Sandbox, folder: Path, repeat: int,
          trees: dict[str, Optional[Path]]) -> dict[str, list[Sample]]:
    """Benchmark 4: time until every rank of a script that does not import torch has started
    (`extra["started"]`, from the command's start), and what the controller used, by each of
    ``trees`` in alternating rounds."""
    env = home_env(folder)
    n = len(sb.hosts)
    samples: dict[str, list[Sample]] = {name: [] for name in trees}

    for round_ in range(repeat):
        for name, tree in trees.items():
            t0 = time.time()
            sample = measure([*_cli(sb, "--no-torchrun", "--nproc-per-node", "1"),
                              str(folder / "started.py")], sb=sb, env=_on(tree, env))
            stamps = [float(m.group(1)) for m in re.finditer(r"\] started \d+ ([\d.]+)",
                                                             sample.stdout)]
            if len(stamps) != n:
                raise RuntimeError(f"{name}: {len(stamps)} of {n} ranks started:\n"
                                   f"{sample.stdout[-800:]}")
            sample.extra["started"] = max(stamps) - t0
            print(f"  round {round_ + 1}/{repeat} {name}, {n} hosts: all started after "
                  f"{sample.extra['started']:.2f} s, done after {sample.wall:.2f} s")
            samples[name].append(sample)
    return samples


def throughput(sb: sandbox.Sandbox, folder: Path, repeat: int, megabytes: float,
               width: int = 100) -> list[Sample]:
    """Benchmark 5: every rank writes its share of ``megabytes``; every line must arrive once,
    in order, on the console and in the mirrors. ``extra``: console MB/s (first payload line to
    last, as read here), mirror check."""
    nproc = 2
    ranks = len(sb.hosts) * nproc
    lines = int(megabytes * 1e6 / width / ranks)
    samples = []
    for round_ in range(repeat):
        sample = _spam_once(sb, folder, nproc, lines, width)
        print(f"  round {round_ + 1}/{repeat}: {sample.extra['megabytes']:.0f} MB, console "
              f"{sample.extra['console_mb_s']:.1f} MB/s, whole launch {sample.wall:.2f} s, "
              "no line lost (console and mirrors)")
        samples.append(sample)
    return samples


def _spam_once(sb: sandbox.Sandbox, folder: Path, nproc: int, lines: int,
               width: int) -> Sample:
    ranks = len(sb.hosts) * nproc
    env = home_env(folder)
    console = Path(env["CLUSTERRUN_HOME"]) / "console.txt"
    try:
        sample = measure([*_cli(sb, "--no-torchrun", "--nproc-per-node", str(nproc),
                                "--env", f"LINES={lines}", "--env", f"WIDTH={width}"),
                          str(folder / "spam.py")], sb=sb, env=env, stdout=console)
        total = lines * width * ranks
        _check_console(console, ranks, lines)
        mirrored = _check_mirrors(Path(env["CLUSTERRUN_HOME"]), ranks, lines, width)
        streaming = console.stat().st_size - 1e6  # from the first MB to the end
    finally:
        shutil.rmtree(env["CLUSTERRUN_HOME"], ignore_errors=True)
    took = sample.extra["last_growth_at"] - sample.extra["first_mb_at"]
    sample.extra.update(console_mb_s=streaming / 1e6 / max(took, 1e-9),
                        end_to_end_mb_s=total / 1e6 / sample.wall, megabytes=total / 1e6,
                        mirrored_mb=mirrored / 1e6)
    return sample


def _check_console(path: Path, ranks: int, lines: int) -> None:
    """Every rank's lines arrived on the console once and in order."""
    seen = [0] * ranks
    with path.open(errors="replace") as handle:
        for line in handle:
            match = SPAM_LINE.search(line.rstrip("\n"))
            if match is None:
                continue
            rank, i = int(match.group(1)), int(match.group(2))
            if i != seen[rank]:
                raise RuntimeError(f"console: rank {rank} line {i} after line {seen[rank] - 1}")
            seen[rank] = i + 1
    if seen != [lines] * ranks:
        raise RuntimeError(f"console: {sum(seen)} of {lines * ranks} lines arrived")


def _check_mirrors(home: Path, ranks: int, lines: int, width: int) -> int:
    """Every rank's mirror holds exactly its lines, in order; returns the bytes mirrored."""
    logs = {int(p.stem.split("-")[1]): p for p in home.glob("runs/*/nodes/*/rank-*.log")}
    if sorted(logs) != list(range(ranks)):
        raise RuntimeError(f"mirrors: rank logs {sorted(logs)}, expected 0..{ranks - 1}")
    total = 0
    for rank, path in logs.items():
        data = path.read_bytes()
        total += len(data)
        body = data.splitlines()
        numbers = [int(m.group(2)) for m in map(SPAM_LINE.search, (b.decode() for b in body))
                   if m is not None and int(m.group(1)) == rank]
        if numbers != list(range(lines)):
            raise RuntimeError(f"mirror of rank {rank}: {len(numbers)} of {lines} lines in order")
    if total < ranks * lines * width:
        raise RuntimeError(f"mirrors: {total} bytes, expected {ranks * lines * width}")
    return total

