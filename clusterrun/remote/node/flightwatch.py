"""The stall watchdog's look at torch's Flight Recorder (stdlib only, Python 3.6+).

A rank waiting for an NCCL collective on a GPU spins a core in a CUDA synchronisation, often in
the script's own line (``loss.item()``): neither its CPU time nor its Python stack says that it
waits, so remote/shared/stallrule.py would count it as computing. Its Flight Recorder says it: the
collective it entered has not completed, and its sequence numbers stand still.

So when a node's only sign of progress has been busy CPU for a while (no output, no bytes
moved), its supervisor asks its ranks for dumps through their pipes (remote/hostlib/flightpipe.py;
launch arms them on GPU hosts), one round every ``every`` seconds while that lasts and never
otherwise: a round costs each rank a dump of its ring buffer and the supervisor the reading (a
few MB per rank). A rank whose dumps of two rounds in a row are the same (no collective entered or
completed, no point-to-point operation recorded) while a collective it entered is still open is
*stuck* since the first of the two: its busy CPU is no progress from then on.
"""

import threading

from clusterrun.remote.hostlib import flightpipe
from clusterrun.remote.shared import flight, timing

WAIT = 5.0  # seconds a round waits for the ranks' dumps
# A verdict holds this long past the round after it was due: a rank that stops dumping (its
# pipe gone, the round still running) is not held stuck on old evidence.
HOLD = 2 * WAIT


class Recorder:
    """One node's ranks through their Flight Recorders: ``stuck`` at each look."""

    def __init__(self, rundir, every):
        self.rundir = rundir
        self.every = every  # seconds between two rounds while the node is in doubt
        self.asked = None  # when the last round was started
        self.round = None  # (thread, {"when", "records"})
        self.seen = {}  # rank -> {"key", "since", "read", "open"}

    def reset(self):
        """The node moved by other means: what was read says nothing about what comes, and a
        round still running is not taken."""
        self.seen = {}
        self.asked = None
        self.round = None

    def stuck(self, now, doubtful):
        """{rank: since when it is stuck}. ``doubtful``: the node's only sign of progress has
        been busy CPU for ``every`` seconds; a round is started then, if one is due and the
        ranks here have Flight Recorder pipes."""
        self._take()
        if (doubtful and self.round is None
                and timing.due(now, self.asked, self.every)):
            self.asked = now
            if flightpipe.armed(self.rundir):
                self._start(now)
        return {rank: s["since"] for rank, s in self.seen.items()
                if s["open"] and s["read"] > s["since"]
                and timing.within(now, s["read"], self.every + HOLD)}

    def _start(self, now):
        got = {"when": now, "records": None}

        def run():
            dumped = flightpipe.ask(self.rundir, WAIT)
            got["records"] = flight.flight(self.rundir, dumped) if dumped else []

        thread = threading.Thread(target=run, daemon=True, name="clusterrun-flight")
        self.round = (thread, got)
        thread.start()

    def _take(self):
        if self.round is None or self.round[0].is_alive():
            return
        got = self.round[1]
        self.round = None
        for record in got["records"] or []:
            if not str(record["rank"]).isdigit():
                continue
            rank, key = int(record["rank"]), flight.key(record)
            before = self.seen.get(rank)
            if before is None or before["key"] != key:
                before = self.seen[rank] = {"key": key, "since": got["when"]}
            before.update(read=got["when"], open=flight.waiting(record))

    def wait(self):
        """Until the round in progress has ended (tests)."""
        if self.round is not None:
            self.round[0].join()
