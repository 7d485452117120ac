"""The session's dispatch to its watchers (launch/watchers.py): a watcher added from outside
session.py hears the events it listens to, after the session recorded them, and its other calls
at their moments."""

from __future__ import annotations

from pathlib import Path

from clusterrun import wire
from clusterrun.launch import watchers
from clusterrun.launch.session import Session
from clusterrun.plan.model import LaunchPlan, NodePlan


def _session() -> Session:
    nodes = tuple(NodePlan(name=f"node{i}", host=f"10.0.0.{i + 1}", local=False, node_rank=i,
                           nproc=1, first_rank=i, interface="eth0", address=f"10.0.0.{i + 1}",
                           python="python3", setup=None, workdir="/w", rundir="/w/r", cwd="/w/c",
                           argv=(), env=()) for i in range(2))
    plan = LaunchPlan(run_id="r1", name="r1", script=Path("/t.py"), args=(),
                      master_addr="10.0.0.1", master_port=29500, nodes=nodes, sync=False,
                      grace=5, lease=30)
    return Session(plan, {}, {}, mirror=None, view=None, notify=[].append)  # type: ignore[arg-type]


class Recorder(watchers.Watcher):
    listens = (wire.End, wire.Progress)

    def __init__(self, session: Session) -> None:
        self.session = session
        self.calls: list[str] = []

    def event(self, name: str, ev: wire.Event, arrived: float) -> None:
        # The session has recorded the event before any watcher hears of it.
        recorded = isinstance(ev, wire.End) and self.session.nodes[name].end is ev
        self.calls.append(f"{type(ev).__name__} {name}{' recorded' if recorded else ''}")

    def stopping(self) -> None:
        self.calls.append("stopping")

    def tick(self, now: float) -> None:
        self.calls.append("tick")

    def finish(self) -> None:
        self.calls.append("finish")


def test_a_watcher_hears_what_it_listens_to_and_finishes_once() -> None:
    session = _session()
    recorder = Recorder(session)
    session.add(recorder)
    assert recorder in session.watchers and len(session.watchers) > 1  # the standard ones too
    session.handle("node0", wire.Started(0.1, 10, 11, "h0"), 1.0)  # not listened to
    session.handle("node0", wire.Progress(0.2, 3.0), 1.0)
    session.stop_all(reason="a test")
    session.handle("node0", wire.End(1.0, "stopped"), 2.0)
    session.handle("node1", wire.End(1.0, "stopped"), 2.0)
    session.watch([], lambda signum, first: None)  # every node has ended: no turn, finish
    assert recorder.calls == ["Progress node0", "stopping", "End node0 recorded",
                              "End node1 recorded", "finish"]
