"""`clusterrun logs`: a run's mirrors replayed, then (with -f) followed on its hosts. A run that
restarted shows one attempt: the current one, or the one asked for."""

from __future__ import annotations

import os
from typing import Callable, Optional

from clusterrun.console import Printer
from clusterrun.errors import Result
from clusterrun.logs import follow as following
from clusterrun.logs.mirror import Mirror
from clusterrun.logs.replay import Collector, replay, replay_rest
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
    fetching = _MirrorLock(run)
    # Nobody watches the run (detached, or its controller died): this command fetches it from
    # its hosts once no other clusterrun process does. One lock in the run folder guards the
    # mirrors of all its attempts.
    unwatched = lifecycle.live(run) and not lifecycle.watched(run)
    if unwatched:
        fetching.take()
    k = attempt or attempts.count(run)
    try:
        _show(run, k, flt, tail=tail, follow=follow, ssh=ssh, printer=printer, say=say,
              fetching=fetching if unwatched else None, journal=journal, label=label)
    finally:
        fetching.close()
    if follow and (fetching.taken or (unwatched and not lifecycle.live(run))):
        # Followed to its end: record how it ended (settled here, or by the process that
        # held the mirrors as it ended).
        state = settle(run, ssh, say, journal)
        _say_root_cause(run, say)
        say(f"run {run.id} {state.value}")
    elif not lifecycle.live(run):
        _say_root_cause(run, say)


class _MirrorLock:
    """The run's mirror lock (``mirror.lock``): its holder alone writes the run's mirrors
    and records what it hears from the hosts."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.fd: Optional[int] = None
        self.taken = False  # held at some point: this process fetched the run

    def take(self) -> bool:
        """Hold the lock, if no other clusterrun process does."""
        if self.fd is None:
            self.fd = self.run.lock_fd("mirror.lock")
            self.taken = self.taken or self.fd is not None
        return self.fd is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _say_root_cause(run: RunDir, say: Callable[[str], None]) -> None:
    """After an ended run's lines: why it failed, as its summary records it (a detached run's
    nobody was there to hear)."""
    root = ps.root_cause(run)
    if root is not None:
        say(f"root cause: {root['detail']}")


def _show(run: RunDir, k: int, flt: Filter, *, tail: Optional[int], follow: bool,
          ssh: SshOptions, printer: Printer, say: Callable[[str], None],
          fetching: Optional[_MirrorLock], journal: Journal, label: Label = prefix) -> None:
    """``fetching``: the mirror lock of a run nobody watches (None: a launch in another
    terminal streams it); while it is held, this process writes the run's mirrors and records
    what it hears (the ranks' first lines: events) in ``journal``."""
    held = fetching is not None and fetching.fd is not None
    shown = attempts.attempt_dir(run, k)

    def going() -> bool:  # an earlier attempt has ended, whatever the run does now
        return k == attempts.count(run) and lifecycle.live(run)

    if held and going():
        # Nobody else mirrors this live run: first fetch what its hosts have now, so what is
        # shown (the tail above all) is the run's present, not where its mirrors stopped.
        mirror = Mirror(shown, journal.first_line_of(k))
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
    if fetching is None:  # a launch in another terminal is streaming this run: read its mirrors
        _wait_local(run, k, (view, positions, offset), flt=flt, printer=printer, say=say,
                    label=label)
        return
    if not held:
        # Another process fetches this run: show what it mirrors until it lets go, then take
        # over from where its mirrors end (the run is this attempt's to its end: nobody is
        # there to restart it).
        took, offset = following.while_held(shown, view, positions, offset, fetching.take)
        if took:
            replay_rest(shown, view, positions, offset)
        if not took or not going():
            view.close()
            return
    mirror = Mirror(shown, journal.first_line_of(k))
    following.follow(shown, ssh, mirror, view, say, on_state=Stalls(journal, k))
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
