"""`clusterrun logs`: a run's mirrors replayed, then (with -f) followed on its hosts. A run that
restarted shows one attempt: the current one, or the one asked for."""

from __future__ import annotations

import os
from typing import Callable, Optional

from clusterrun.console import Printer
from clusterrun.errors import Result
from clusterrun.logs import follow as following
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.replay import Collector, replay
from clusterrun.logs.settle import Stalls, settle
from clusterrun.logs.view import Filter, LogView, prefix
from clusterrun.runs import attempts, lifecycle, ps
from clusterrun.runs.journal import Journal
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions

Label = Callable[[str, str], str]  # (node, file) -> what the printer gets as the prefix
Position = tuple[LogView, dict[tuple[str, str], int], int]  # the view, per-file bytes, index


def show(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
         printer: Printer, say: Callable[[str], None], attempt: Optional[int] = None,
         label: Label = prefix) -> Result:
    """Show attempt ``attempt`` of ``run`` (default: its current one); ``label``: what
    ``printer`` is given as each line's prefix."""
    run = attempts.top(run)
    with Journal.of(run, say) as journal:  # this command's one journal of the run
        _shown(run, flt, tail=tail, follow=follow, ssh=ssh, printer=printer, say=say,
               attempt=attempt, journal=journal, label=label)
    return Result()  # shown: what the run came to is `ps`'s to say


def _shown(run: RunDir, flt: Filter, *, tail: Optional[int], follow: bool, ssh: SshOptions,
           printer: Printer, say: Callable[[str], None], attempt: Optional[int],
           journal: Journal, label: Label) -> None:
    # Whichever command looks first at a run nobody watches fetches what its hosts have; a
    # finished one is then verified, summarised and recorded (logs.settle).
    settle(run, ssh, say, journal)
    # What NCCL chose on each host, kept in the summary, above the lines (the launch said it
    # as the ranks initialised: a detached run's or an earlier terminal's nobody saw).
    for line in ps.nccl_lines(ps.nccl_summary(run, attempt)):
        say(line)
    lock = None
    if lifecycle.live(run) and not lifecycle.watched(run):
        # One lock in the run folder guards the mirrors of all its attempts.
        lock = run.lock_fd("mirror.lock")  # None: another clusterrun is fetching this run
    k = attempt or attempts.count(run)
    try:
        # The one fetching a run nobody watches records its ranks' first lines (events).
        _show(run, k, flt, tail=tail, follow=follow, ssh=ssh, printer=printer, say=say,
              lock=lock, journal=journal if lock is not None else None, label=label)
    finally:
        if lock is not None:
            os.close(lock)
    if follow and lock is not None:  # followed to its end from the hosts: record how it ended
        state = settle(run, ssh, say, journal)
        _say_root_cause(run, say)
        say(f"run {run.id} {state.value}")
    elif not lifecycle.live(run):
        _say_root_cause(run, say)


def _say_root_cause(run: RunDir, say: Callable[[str], None]) -> None:
    """After an ended run's lines: why it failed, as its summary records it (a detached run's
    nobody was there to hear)."""
    root = ps.root_cause(run)
    if root is not None:
        say(f"root cause: {root['detail']}")


def _show(run: RunDir, k: int, flt: Filter, *, tail: Optional[int], follow: bool,
          ssh: SshOptions, printer: Printer, say: Callable[[str], None],
          lock: Optional[int], journal: Optional[Journal] = None, label: Label = prefix) -> None:
    """``journal``: this process writes the run's mirrors and records what it hears."""
    first_line = journal.first_line_of(k) if journal is not None else None
    shown = attempts.attempt_dir(run, k)

    def going() -> bool:  # an earlier attempt has ended, whatever the run does now
        return k == attempts.count(run) and lifecycle.live(run)

    if lock is not None and going():
        # Nobody else mirrors this live run: first fetch what its hosts have now, so what is
        # shown (the tail above all) is the run's present, not where its mirrors stopped.
        mirror = Mirror(shown, first_line)
        following.follow(shown, ssh, mirror, None, say, keep_following=False)
        mirror.close()
    if tail is not None:
        collector = Collector(tail)
        view = LogView(collector, flt, label)  # type: ignore[arg-type]
        positions, offset = replay(shown, view, collector.chunk)
        if not follow or not going():
            view.close()
        for key, prefix, text, at in collector.lines:
            printer.line(key, prefix, text, at=at)
        view.printer = printer  # what follows continues each file where the tail left it
    else:
        view = LogView(printer, flt, label)
        positions, offset = replay(shown, view)
    if not follow or not going():
        view.close()
        if follow and k < attempts.count(run):
            say(f"attempt {k} of run {run.id} has ended; follow the current one with "
                f"`clusterrun logs -f {run.id}`")
        return
    if lock is None:  # a launch in another terminal is streaming this run: read its mirrors
        _wait_local(run, k, (view, positions, offset), flt=flt, printer=printer, say=say,
                    label=label)
        return
    mirror = Mirror(shown, first_line)
    following.follow(shown, ssh, mirror, view, say,
                     on_state=Stalls(journal, k) if journal is not None else None)
    mirror.close()


def _wait_local(run: RunDir, k: int, at: Position, *, flt: Filter, printer: Printer,
                say: Callable[[str], None], label: Label) -> None:
    """Follow the mirrors a launch in another terminal writes, attempt after attempt: when the
    run restarts, go on with the new attempt's files from their first byte."""
    while True:
        following.wait_local(attempts.attempt_dir(run, k), *at)
        if attempts.count(run) <= k:  # the run ended with this attempt, or its launch died
            return
        k += 1
        say(attempts.started_text(run, k))
        view = LogView(printer, flt, label)
        at = (view, *replay(attempts.attempt_dir(run, k), view))
