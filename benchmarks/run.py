"""clusterrun against the tools users would pick instead, on sandbox clusters built here.

    sudo .venv/bin/python benchmarks/run.py                       # everything, 3 rounds
    sudo .venv/bin/python benchmarks/run.py --sizes 8,32 --repeat 1 --only fanout   # quick

Benchmarks (--only): fanout (exec, clush, pdsh: `hostname` on every host), check (a full
`clusterrun check`, in the same rounds as fanout), launch (4-host gloo all-reduce against
parallel ssh + torchrun), start (a script without torch on --start-hosts hosts, and on 4),
logs (4 hosts x 2 ranks printing --log-mb MB as fast as they can, every line counted), rc
(exec, check and launch on --rc-hosts hosts whose ~/.bashrc starts a Python on every login, as
a `conda init` block does, next to clush and the hand-typed floor, with each host's logins).
`--baseline REV` adds clusterrun at another commit to launch and start, in the same rounds, so
that a change is compared with what it replaces in one run.

Candidates run in alternating rounds (A B C A B C ...) and the tables give medians: compare the
ratios, not absolute seconds, which depend on the machine and on what else runs on it.
Writes the tables as Markdown (--out, quoted by docs/performance.md), the raw samples next to it
(.json) and a PNG of time against host count (--plot; needs matplotlib: the `bench` extra). Both
files start with the commit measured (and whether the code differed from it), the machine and
the exact command (common.provenance).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Optional

import common
import fanout
import launch
import logins
import report

BENCHMARKS = ("fanout", "check", "launch", "start", "logs", "rc")
Sections = list[tuple[str, str]]


def _fanout(sizes: list[int], chosen: list[str], args: argparse.Namespace, sections: Sections,
            raw: dict[str, object]) -> str:
    """Returns a note on the plot."""
    by_size = {}
    for n in sizes:
        print(f"{n} hosts: building the sandbox", flush=True)
        with common.cluster(n) as sb:
            results = fanout.run(sb, args.repeat, with_check="check" in chosen)
            if "fanout" not in chosen:
                results = {k: v for k, v in results.items() if k in (fanout.CHECK, fanout.CLUSH)}
            by_size[n] = results
    sections.append(("`hostname` on every host, and a full check", report.fanout_table(by_size)))
    raw["fanout"] = by_size
    missing = report.plot(by_size, args.plot)
    return missing or f"plot: {args.plot.name}"


def _launch(chosen: list[str], args: argparse.Namespace, sections: Sections,
            raw: dict[str, object]) -> None:
    with contextlib.ExitStack() as stack:
        baseline = None
        if args.baseline:
            baseline = (args.baseline, stack.enter_context(common.checkout(args.baseline)))
        _launches(chosen, args, launch.named(baseline), sections, raw)


def _launches(chosen: list[str], args: argparse.Namespace, trees: dict[str, Optional[Path]],
              sections: Sections, raw: dict[str, object]) -> None:
    starts = {}
    with launch.payloads() as folder, common.cluster(4) as sb:
        if "launch" in chosen:
            print("launch, 4 hosts", flush=True)
            results = launch.end_to_end(sb, folder, args.repeat, trees)
            sections.append(("Launch end to end", report.launch_table(results)))
            raw["launch"] = results
        if "start" in chosen:
            print("start, 4 hosts", flush=True)
            starts[4] = launch.start(sb, folder, args.repeat, trees)
        if "logs" in chosen:
            print(f"logs, 4 hosts x 2 ranks, {args.log_mb:g} MB", flush=True)
            samples = launch.throughput(sb, folder, args.repeat, args.log_mb)
            sections.append(("Log throughput", report.throughput_table(samples)))
            raw["logs"] = samples
    if "start" in chosen:
        with launch.payloads() as folder, common.cluster(args.start_hosts) as sb:
            print(f"start, {args.start_hosts} hosts", flush=True)
            starts[args.start_hosts] = launch.start(sb, folder, args.repeat, trees)
        sections.append(("Start of a script without torch (`--no-torchrun`)",
                         report.start_table(starts)))
        raw["start"] = starts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,64,128",
                        help="host counts for fanout and check (default: 8,32,64,128)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default: 3)")
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--start-hosts", type=int, default=64,
                        help="hosts for the start benchmark (default: 64; 4 is measured too)")
    parser.add_argument("--rc-hosts", default="8,32",
                        help="host counts for the rc benchmark (default: 8,32)")
    parser.add_argument("--log-mb", type=float, default=100.0,
                        help="megabytes the logs benchmark prints in all (default: 100)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also measure launch and start with clusterrun at REV (a commit, "
                        "tag or branch, checked out and compiled beside this one), in the same "
                        "alternating rounds")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results.md",
                        help="the Markdown tables (default: benchmarks/results.md); raw "
                        "samples go next to it as .json")
    parser.add_argument("--plot", type=Path, default=Path(__file__).parent / "results.png",
                        help="the PNG of time against host count (default: "
                        "benchmarks/results.png)")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}: pick from {', '.join(BENCHMARKS)}")
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    common.compiled(common.REPO)  # as pip installs it: with .pyc, not compiled on each run
    prov = common.provenance()
    sections: Sections = []
    notes: list[str] = []
    raw: dict[str, object] = {}
    began = time.monotonic()
    if "fanout" in chosen or "check" in chosen:
        notes.append(_fanout(sizes, chosen, args, sections, raw))
    if {"launch", "logs", "start"} & set(chosen):
        _launch(chosen, args, sections, raw)
    if "rc" in chosen:
        rc_sizes = sorted({int(s) for s in args.rc_hosts.split(",") if s.strip()})
        raw["rc"] = by_size = logins.run(rc_sizes, args.repeat, launch.home_env)
        sections.append(("With a heavy ~/.bashrc on every host (one Python per login)",
                         report.logins_table(by_size)))
    notes.append(f"{args.repeat} alternating rounds, {time.monotonic() - began:.0f} s in all")
    common.finish(prov)
    args.out.write_text(report.document(prov, sections, notes))
    common.write_json(args.out.with_suffix(".json"), {"provenance": prov, **raw})
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
