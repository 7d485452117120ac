"""`top --profile SECONDS`: `stacks --profile` (clusterrun/stacks) over and over on a thread of
its own, its latest wait shares and stragglers laid over top's frames."""

from __future__ import annotations

import threading
from typing import Optional

from clusterrun.errors import ClusterrunError
from clusterrun.observe.frame import Frame
from clusterrun.runs.store import RunDir
from clusterrun.stacks import collect
from clusterrun.stacks.model import Collected
from clusterrun.transport import SshOptions


class Profiler:
    """One profile window after another, until closed; ``latest`` is the last complete one."""

    def __init__(self, run: RunDir, ssh: SshOptions, seconds: float) -> None:
        self.run = run
        self.ssh = ssh
        self.seconds = seconds
        self.latest: Optional[Collected] = None
        self.error: Optional[str] = None
        self.done = threading.Event()  # set after each window
        self.closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self.loop, daemon=True, name="top-profile").start()

    def loop(self) -> None:
        while not self.closed.is_set():
            self.once()

    def once(self) -> None:
        try:
            self.latest = collect.collect(self.run, self.ssh, profile=self.seconds)
            self.error = None
        except ClusterrunError as exc:
            self.error = exc.message
            self.closed.wait(self.seconds)
        self.done.set()

    def close(self) -> None:
        self.closed.set()

    def apply(self, frame: Frame) -> Frame:
        """The frame with each rank's wait share and the stragglers (an empty list before
        the first window has ended: the view shows the column from the start)."""
        found = self.latest
        shares = {r.rank: r.wait_share for r in found.ranks} if found else {}
        frame.stragglers = list(found.stragglers or []) if found else []
        for rank in frame.ranks:
            rank.wait_share = shares.get(rank.rank)
            if rank.rank in frame.stragglers:
                rank.flags.append("straggler")
        return frame


def to_json(frame: Frame) -> dict[str, object]:
    """`top --json --profile`: the frame's JSON with `stacks --profile`'s two additions."""
    out = frame.to_json()
    for entry, rank in zip(out["ranks"], frame.ranks):
        entry["wait_share"] = rank.wait_share
    out["stragglers"] = frame.stragglers or []
    return out
