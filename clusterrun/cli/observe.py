"""`clusterrun top`: a live view of a running run, from any shell."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional

import click

from clusterrun.cli import complete, selectors
from clusterrun.cli.common import CONTEXT, home, make_options, note, ssh_options
from clusterrun.errors import Result, UsageError
from clusterrun.runs import names

if TYPE_CHECKING:  # the command imports its modules when it runs: `--help` starts fast
    from clusterrun.observe.frame import Frame
    from clusterrun.observe.profiling import Profiler
    from clusterrun.observe.watch import Watch


@contextlib.contextmanager
def quit_key() -> Iterator[threading.Event]:
    """An event set when the user presses q (the terminal in cbreak mode meanwhile)."""
    quit_ = threading.Event()
    if not sys.stdin.isatty():
        yield quit_
        return
    import select
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read() -> None:
        while not quit_.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready and sys.stdin.read(1) in ("q", "Q"):
                quit_.set()

    reader = threading.Thread(target=read, daemon=True, name="top-keys")
    reader.start()
    try:
        yield quit_
    finally:
        quit_.set()
        # Ended (within one select) before the terminal is given back: it reads no key meant
        # for the shell.
        reader.join()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              metavar="SECONDS", help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="One sample, printed, then exit.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON: one object per refresh (one line each), or just one with --once.")
@click.option("--profile", type=click.FloatRange(min=1, max=600), default=None,
              metavar="SECONDS", help="Also sample every rank's stack in windows of SECONDS, "
              "as `stacks --profile` does: each rank's wait share, and the straggler.")
@selectors.node_option
@selectors.rank_option
@ssh_options
def top(run_id: Optional[str], interval: float, once: bool, as_json: bool,
        profile: Optional[float], nodes: tuple[str, ...], ranks_: tuple[int, ...],
        connect_timeout: float, accept_new_host_keys: bool) -> Result:
    """A live view of a running run (the newest by default), attached or detached.

    Per host: CPU %, memory, load, network MB/s on the run's interface, free disk under the
    run's folder, GPUs. Per rank: pid, CPU %, RSS, lines per minute, last line, seconds
    silent; slow and silent ranks flagged (against all the run's ranks, also when --node or
    --rank show some). One connection per host, kept; a host that stops answering shows as
    lost within two intervals. q or Ctrl-C quits.
    """
    from clusterrun.observe.profiling import Profiler
    from clusterrun.observe.watch import Watch
    from clusterrun.runs import attempts, lifecycle
    from clusterrun.runs.records import PlanRecord

    run = names.resolve(home(write=False), run_id, note=note, prefer=lifecycle.live)
    if not lifecycle.live(run):
        state = lifecycle.recorded(run)
        raise UsageError(f"run {run.id} has ended ({state.value if state else 'unknown'}); "
                         "`top` watches running runs. See how it went with `clusterrun logs "
                         f"{run.id}` or `clusterrun ps`.")
    plan = PlanRecord.of(attempts.current(run))
    selectors.check(plan, nodes, ranks_, f"run {run.id}")
    ssh = make_options(connect_timeout, accept_new_host_keys)
    watch = Watch(run, ssh, interval)
    pick = Pick(frozenset(selectors.holding(plan, nodes, ranks_)), frozenset(ranks_)) \
        if nodes or ranks_ else None
    profiler = Profiler(run, ssh, profile) if profile else None
    watch.start()
    try:
        if once:
            return Result(unreachable=not _once(watch, profiler, as_json, pick))
        if profiler is not None:
            profiler.start()
        if as_json:
            _json_lines(watch, profiler, pick)
        else:
            _live(watch, profiler, pick)
        return Result()
    finally:
        watch.close()
        if profiler is not None:
            profiler.close()


@dataclasses.dataclass(frozen=True)
class Pick:
    """What --node and --rank leave of each frame: the hosts that hold a chosen rank on a
    chosen node, and the chosen ranks on them (empty ``ranks``: every rank there)."""

    nodes: frozenset[str]
    ranks: frozenset[int]

    def apply(self, frame: Frame) -> Frame:
        return dataclasses.replace(
            frame, hosts=[h for h in frame.hosts if h.node in self.nodes],
            ranks=[r for r in frame.ranks if r.node in self.nodes
                   and (not self.ranks or r.rank in self.ranks)])


def _take(watch: Watch, profiler: Optional[Profiler], pick: Optional[Pick],
          wait: Optional[float] = None, window: Optional[float] = None) -> Frame:
    frame = watch.refresh(wait, window)
    frame = profiler.apply(frame) if profiler is not None else frame
    return pick.apply(frame) if pick is not None else frame


def _json(frame: Frame, profiler: Optional[Profiler]) -> dict[str, object]:
    """The frame's object, ``ok`` first: whether every host gave its sample."""
    from clusterrun.observe.profiling import to_json

    ok = all(h.status == "ok" for h in frame.hosts)
    return {"ok": ok, **(to_json(frame) if profiler is not None else frame.to_json())}


def _once(watch: Watch, profiler: Optional[Profiler], as_json: bool,
          pick: Optional[Pick]) -> bool:
    """One sample, shown; False when a host gave none."""
    import json

    watch.wait_connected(watch.ssh.connect_timeout + 5)
    if profiler is not None:
        profiler.once()  # one window; the sample after it
        if profiler.error:
            note(f"no profile: {profiler.error}")
        for why in sorted((profiler.latest.problems if profiler.latest else {}).values()):
            note(f"no profile from {why}")
    # Rates (CPU, network, lines per minute) over at least one interval: each host's sampler
    # starts it at a reading the run's supervisor kept that long ago and answers at once, or
    # (a run younger than that, a supervisor of an older clusterrun) waits out the rest.
    frame = _take(watch, profiler, pick, wait=watch.interval + watch.ssh.connect_timeout,
                  window=watch.interval)
    if as_json:
        click.echo(json.dumps(_json(frame, profiler), indent=2))
    else:
        from rich.console import Console

        from clusterrun.observe.view import render

        Console().print(render(frame, live=False))
    lost = [h for h in frame.hosts if h.status != "ok"]
    if lost:
        for host in lost:
            note(f"{host.node}: no sample ({host.reason or 'no answer'}); its figures are "
                 "null. Check the host is up and reachable (`clusterrun ps` asks it too).")
    return not lost


def _json_lines(watch: Watch, profiler: Optional[Profiler], pick: Optional[Pick]) -> None:
    import json
    import time

    # No line of nulls for hosts still connecting: the first line comes once they answer.
    watch.wait_connected(watch.ssh.connect_timeout + 5)
    time.sleep(watch.interval)
    while True:
        frame = _take(watch, profiler, pick)
        click.echo(json.dumps(_json(frame, profiler)))
        if frame.ended:
            return


def _live(watch: Watch, profiler: Optional[Profiler], pick: Optional[Pick]) -> None:
    import time

    from rich.console import Console
    from rich.live import Live

    from clusterrun.observe.view import render
    if not sys.stdout.isatty():
        raise UsageError("`clusterrun top` draws a live view and needs a terminal; for output "
                         "to a file or a pipe use `--once` or `--json`.")
    console = Console()
    frame = None
    with quit_key() as quit_, Live(console=console, screen=True, auto_refresh=False) as live:
        while not quit_.is_set():
            began = time.monotonic()
            frame = _take(watch, profiler, pick)
            live.update(render(frame), refresh=True)
            if frame.ended:
                break
            quit_.wait(max(0.0, watch.interval - (time.monotonic() - began)))
    if frame is not None and frame.ended:
        states = sorted({h.node_state for h in frame.hosts})
        note(f"run {frame.run} has ended on every host ({', '.join(states)}).")
