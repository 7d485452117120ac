"""A stall where no rank stands out: the decision that tests the hosts' links again and puts the
stall on the host whose links fail (or says the links are fine), without a cluster."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun import wire
from clusterrun.inventory.ranges import fold
from clusterrun.preflight import mesh
from clusterrun.preflight.report import Blocked, Pairs
from clusterrun.remote.node import linkwatch, stallhub, stallreach
from clusterrun.remote.shared import linkrule, protocol, stallreport
from clusterrun.runs.store import RunDir
from clusterrun.stacks import links, stallview
from clusterrun.stacks.model import Collected, Frame, RankStack, Thread
from clusterrun.transport import SshOptions

# Not an address this host holds, and where nothing can be sent either: IPv6 link-local on
# the loopback device (the kernel refuses both bind and connect with EINVAL, and where IPv6 is
# off the socket cannot even be made). Never an address of another machine.
UNBINDABLE = "fe80::1%lo"

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
HOSTS = ["node1", "node2", "node3"]
ADDRESSES = {"node1": "10.79.0.1", "node2": "10.79.0.2", "node3": "10.79.0.3"}


def waiting(number: int, node: str) -> RankStack:
    main = Thread("MainThread", (Frame("<module>", "/job/train.py", 49),
                                 Frame("all_reduce", TORCH, 3252)))
    return RankStack(number, node, 1000 + number, (main,), last_line=f"rank {number} step 2")


def judge(found: links.Links) -> tuple[list[str], dict[str, Any], Optional[str]]:
    """linkrule's judgement of what the controller's re-test found, host names folded by
    ClusterShell's NodeSet: the words a hub, which folds by its own rule, must match."""
    return linkrule.judge(found.hosts, found.blocked, found.addresses, found.untested, fold=fold)


def cut(host: str) -> list[Blocked]:
    """Every pair into and out of ``host`` times out, as when its data path is cut."""
    others = [h for h in HOSTS if h != host]
    return ([Blocked(o, host, "timed out after 5 s") for o in others]
            + [Blocked(host, o, "timed out after 5 s") for o in others])


def test_failing_pairs_put_the_stall_on_the_host_nobody_reaches() -> None:
    lines, record, blamed = judge(links.Links(HOSTS, cut("node2"), ADDRESSES))
    assert blamed == "node2"
    assert lines == ["stall: root cause: node2's links fail: node[1,3] cannot connect to node2 "
                     "(10.79.0.2) on an ephemeral port: timed out after 5 s; node2 cannot "
                     "connect to node[1,3] on an ephemeral port: timed out after 5 s"]
    assert record["blamed"] == ["node2"] and not record["fine"]
    host, detail = stallreport.stop(lines, {"odd": [], "links": record})
    assert host == "node2"
    assert detail.startswith("stalled, its links fail: node[1,3] cannot"), detail


def test_one_host_that_reaches_nobody_is_blamed_not_its_peers() -> None:
    """Only node3's egress is cut: nobody else fails, so the pairs it opened are its own."""
    out = [Blocked("node3", o, "timed out after 5 s") for o in ("node1", "node2")]
    _lines, _record, blamed = judge(links.Links(HOSTS, out, ADDRESSES))
    assert blamed == "node3"


def test_every_pair_connecting_says_the_links_are_fine() -> None:
    lines, record, blamed = judge(links.Links(HOSTS, [], ADDRESSES))
    assert blamed is None and record["fine"]
    assert lines == ["stall: links fine: every pair of the run's 3 hosts connects on an "
                     "ephemeral port of the run's addresses, so no host's data path is the "
                     "cause"]


def test_a_host_that_could_not_be_tested_is_said_and_not_blamed() -> None:
    found = links.Links(HOSTS[:2], [], ADDRESSES, {"node3": "node3: no answer within 20 s"})
    lines, record, blamed = judge(found)
    assert blamed is None and record["untested"] == {"node3": "node3: no answer within 20 s"}
    assert lines[-1] == "stall: links of node3 not tested: node3: no answer within 20 s"


class AttachedMaster:
    """The master's supervisor of an attached run as its stall decider (remote/node/stallhub.py)
    sees it: its events (for the controller) and its own failure."""

    def __init__(self, rundir: Path) -> None:
        self.name = "node1"
        self.rundir = str(rundir)
        self.hub = self.peer = None
        self.events: list[wire.Event] = []
        self.failed: list[tuple[int, str]] = []

    def event(self, kind: str, **fields: Any) -> None:
        self.events.append(wire.parse({protocol.KIND: kind, protocol.ELAPSED: 0.0, **fields}))

    def roots(self) -> list[int]:
        return []

    def running(self) -> bool:
        return True

    def state(self, **fields: Any) -> None:
        pass

    def fail(self, code: int, detail: str, cause: str, force: bool = False) -> None:
        self.failed.append((code, detail))


def turns(decider: stallhub.Decider, master: AttachedMaster,
          view: stallview.StallView) -> list[wire.Event]:
    """A few turns of the master's loop, its events handled by the controller's view at once
    (as launch/watchers.py ``Stalls`` does): the events."""
    seen: list[wire.Event] = []
    for _turn in range(5):
        decider.turn(time.monotonic())
        events, master.events = master.events, []
        for ev in events:
            seen.append(ev)
            if isinstance(ev, wire.StallAsk):
                view.ask(ev.what).join(10)
            elif isinstance(ev, wire.Stalled):
                view.stalled(ev)
            elif isinstance(ev, wire.Resumed):
                view.resumed()
    return seen


def fire(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ranks: list[RankStack],
         blocked: list[Blocked]) -> tuple[list[tuple[Optional[str], dict[str, Any]]], list[str],
                                          list[str]]:
    """One stall of a stopping attached run, decided by the master's supervisor and shown by
    the controller (stacks/stallview.py), which collects the stacks and re-tests the links for
    it: what was decided (the report, then the stop, to which node: None is the master, which
    fails itself), said, and re-tested."""
    retested: list[str] = []
    monkeypatch.setattr(stallview, "collect", lambda run, ssh: Collected("r", ranks))

    def retest(run: RunDir, ssh: SshOptions) -> links.Links:
        retested.append("yes")
        return links.Links(HOSTS, blocked, ADDRESSES)

    monkeypatch.setattr(links, "retest", retest)
    master = AttachedMaster(tmp_path)
    req = {"stall_timeout": 8, "on_stall": protocol.STALL_STOP, "stall_nodes": HOSTS}
    decider = stallhub.Decider(master, req, stallreach.ByController(master, 8, HOSTS))
    decider.progress.quiet = lambda now: 9.0  # type: ignore[method-assign]
    sent: list[tuple[Optional[str], dict[str, Any]]] = []
    said: list[str] = []

    def send(node: str, op: dict[str, Any]) -> None:
        if op[protocol.OP] == protocol.Lifeline.STALL:
            sent.append((node, op))
        else:
            decider.on_op(op)

    view = stallview.StallView(RunDir(tmp_path), HOSTS, 8, SshOptions(), master="node1",
                               send=send, say=said.append, record=lambda found: None)
    for host in HOSTS[1:]:
        view.progress(host, 9.0)
    for ev in turns(decider, master, view):
        if isinstance(ev, wire.Stalled):
            sent.insert(0, (None, {"lines": list(ev.lines), "report": ev.report}))
    sent.extend((None, {"fail": True, "detail": detail.split(": ", 1)[1]})
                for _code, detail in master.failed)
    return sent, said, retested


def test_an_attached_report_is_shown_and_the_run_moving_again_ends_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--on-stall report on an attached run: the master decides, the controller prints and
    records its report and stops nothing; once a node moves again the master says so, and the
    controller prints "stall over" and records that the run runs again."""
    main = Thread("MainThread", (Frame("<module>", "/job/train.py", 44),
                                 Frame("load_batch", "/job/data.py", 30)))
    ranks = [*(waiting(r, HOSTS[r // 2]) for r in range(5)),
             RankStack(5, "node3", 1005, (main,), last_line="rank 5 step 2")]
    monkeypatch.setattr(stallview, "collect", lambda run, ssh: Collected("r", ranks))
    master = AttachedMaster(tmp_path)
    req = {"stall_timeout": 8, "on_stall": protocol.STALL_REPORT, "stall_nodes": HOSTS}
    decider = stallhub.Decider(master, req, stallreach.ByController(master, 8, HOSTS))
    quiet = [9.0]
    decider.progress.quiet = lambda now: quiet[0]  # type: ignore[method-assign]
    stops: list[tuple[str, dict[str, Any]]] = []
    said: list[str] = []
    recorded: list[Optional[dict[str, Any]]] = []

    def send(node: str, op: dict[str, Any]) -> None:
        if op[protocol.OP] == protocol.Lifeline.STALL:
            stops.append((node, op))
        else:
            decider.on_op(op)

    view = stallview.StallView(RunDir(tmp_path), HOSTS, 8, SshOptions(), master="node1",
                               send=send, say=said.append, record=recorded.append)
    for host in HOSTS[1:]:
        view.progress(host, 9.0)
    turns(decider, master, view)
    assert said[0] == "stall: no rank made progress for 8 s; 6 ranks, 2 different stacks", said
    assert "stall: odd one out: rank 5 on node3 (pid 1005)" in said[1], said
    assert len(recorded) == 1 and recorded[0] is not None
    assert [r["rank"] for r in recorded[0]["odd"]] == [5]
    assert [r["rank"] for r in recorded[0]["stacks"]] == list(range(6))  # the controller's
    assert not stops and not master.failed
    quiet[0] = 0.5  # the master's ranks move again
    turns(decider, master, view)
    assert said[-1] == "stall over: the run moves again" and recorded[-1] is None
    assert len(said) == 4 and len(recorded) == 2, (said, recorded)


def test_no_odd_rank_and_a_cut_host_stops_that_host_not_the_master(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ranks = [waiting(r, HOSTS[r // 2]) for r in range(6)]
    sent, said, _ = fire(monkeypatch, tmp_path, ranks, cut("node2"))
    node, stop = sent[-1]
    assert node == "node2" and stop["fail"], sent
    assert stop["detail"].startswith("stalled, its links fail: node[1,3] cannot"), stop
    assert any(x.startswith("stall: root cause: node2's links fail") for x in said), said
    report = sent[0][1]["report"]
    assert report["links"]["blamed"] == ["node2"], report
    from clusterrun.wire import RootCause

    assert RootCause("node2", None, 7, f"node2: {stop['detail']}").blamed_node == "node2"


def test_no_odd_rank_and_fine_links_stop_at_the_master_and_blame_no_host(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every rank waits in the same collective and every link connects: the master ends the
    run, but nothing is known against it, so no host is recorded or replaced."""
    from clusterrun.runs.journal import stopped_stall
    from clusterrun.wire import RootCause

    ranks = [waiting(r, HOSTS[r // 2]) for r in range(6)]
    sent, said, _ = fire(monkeypatch, tmp_path, ranks, [])
    node, stop = sent[-1]
    assert node is None and stop["fail"], sent  # None: the master's supervisor stops the run
    assert any(x.startswith("stall: links fine:") for x in said), said
    cause = RootCause("node1", None, 7, f"node1: {stop['detail']}")
    assert cause.stalled and cause.blamed_node is None and cause.blamed_rank is None, cause
    recorded = stopped_stall(cause.public())
    assert recorded is not None and recorded["stalled"]["node"] is None, recorded
    assert recorded["stalled"]["why"].startswith("no rank made progress"), recorded


def test_an_odd_rank_out_needs_no_link_test(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    main = Thread("MainThread", (Frame("<module>", "/job/train.py", 44),
                                 Frame("load_batch", "/job/data.py", 30)))
    ranks = [*(waiting(r, HOSTS[r // 2]) for r in range(5)),
             RankStack(5, "node3", 1005, (main,), last_line="rank 5 step 2")]
    sent, _said, retested = fire(monkeypatch, tmp_path, ranks, cut("node2"))
    assert not retested
    assert sent[-1][0] == "node3"


class HubNode:
    """The master's supervisor as the hub's decider (remote/node/stallhub.py) sees it: what it
    records, sends to its peers and fails with."""

    def __init__(self, rundir: Path) -> None:
        self.name = "node1"
        self.rundir = str(rundir)
        self.peer = None
        self.hub = FakeHub(HOSTS[1:])
        self.recorded: list[dict[str, Any]] = []
        self.hub.record = self.recorded.append  # type: ignore[attr-defined]
        self.failed: list[tuple[int, str]] = []

    def roots(self) -> list[int]:
        return []

    def state(self, **fields: Any) -> None:
        pass

    def fail(self, code: int, detail: str, cause: str, force: bool = False) -> None:
        self.failed.append((code, detail))


STOPS = {  # the stacks and the re-tested links of a stall, and the host it is put on
    "odd rank": ([*(waiting(r, HOSTS[r // 2]) for r in range(5)),
                  RankStack(5, "node3", 1005, (Thread("MainThread", (
                      Frame("<module>", "/job/train.py", 44),
                      Frame("load_batch", "/job/data.py", 30))),), last_line="step 2")],
                 cut("node2"), "node3"),
    "links": ([waiting(r, HOSTS[r // 2]) for r in range(6)], cut("node2"), "node2"),
    "neither": ([waiting(r, HOSTS[r // 2]) for r in range(6)], [], None),
}


@pytest.mark.parametrize("case", sorted(STOPS))
def test_the_hub_stops_the_host_the_controller_stops(case: str, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """One rule (stallreport.stop) picks the host a stopped stall fails and its failure's
    detail: the controller sends the stop there, and the hub, given the same report, stops
    the same host with the same detail (an odd rank's host is told over the gang, a host whose
    links fail is recorded as failed by the hub, neither: the master fails itself)."""
    ranks, blocked, host = STOPS[case]
    sent, _said, _ = fire(monkeypatch, tmp_path, ranks, blocked)
    node, stop = sent[-1]
    assert node == host, sent
    lines, report = sent[0][1]["lines"], sent[0][1]["report"]
    assert stallreport.stop(lines, report) == (host, stop["detail"])
    master = HubNode(tmp_path)
    hub = stallhub.Decider(master, {"stall_timeout": 8, "on_stall": protocol.STALL_STOP},
                           stallreach.ByGang(master, 8))
    hub.stalled(lines, report)
    told = {peer: box for peer, box in master.hub.outbox.items() if box}
    if case == "odd rank":
        assert told == {"node3": [{protocol.OP: protocol.Gang.STALL_STOP,
                                   "detail": stop["detail"]}]}, told
        assert not master.recorded and not master.failed
    elif case == "links":
        assert [(r["node"], r["detail"]) for r in master.recorded] == [
            ("node2", f"node2: {stop['detail']}")]
        assert stop["detail"].startswith("stalled, its links fail: node[1,3] cannot"), stop
        assert not told and not master.failed
    else:
        assert master.failed == [(7, f"node1: {stop['detail']}")]
        assert not told and not master.recorded


def local_run(tmp_path: Path, addresses: dict[str, str]) -> RunDir:
    """A run whose hosts are all this machine (no SSH), each using ``addresses[name]``."""
    nodes = [{"name": name, "host": "localhost", "node_rank": i, "address": address,
              "connection": {"python": sys.executable}}
             for i, (name, address) in enumerate(addresses.items())]
    (tmp_path / "plan.json").write_text(json.dumps({"nodes": nodes}))
    return RunDir(tmp_path)


def test_the_hosts_really_connect_and_one_that_cannot_listen_is_untested(
        tmp_path: Path) -> None:
    """remote/tools/linkcheck.py as shipped, on this machine: two hosts on loopback addresses
    connect to each other; a host whose address is not this machine's cannot listen and is not
    tested (nor blamed)."""
    found = links.retest(local_run(tmp_path, {"a": "127.0.0.1", "b": "127.0.0.2",
                                              "c": UNBINDABLE}), SshOptions())
    assert (found.hosts, found.blocked) == (["a", "b"], [])
    assert found.untested["c"].startswith(f"c: cannot listen on an ephemeral port of {UNBINDABLE}:")
    lines, _record, blamed = judge(found)
    assert blamed is None
    assert lines[0].startswith("stall: links fine: every pair of the run's 2 hosts"), lines


def hub_judges(blocked: list[Blocked], untested: dict[str, str]) -> Any:
    """The detached hub's own judging (linkwatch.HubTest) of these pairs: node1 is the hub,
    every host listened at its address, and each answered its connects."""
    test = linkwatch.HubTest(FakeHub(HOSTS[1:]), "127.0.0.1", time.monotonic())
    test.side.close()
    test.ports = {h: (ADDRESSES[h], 40000) for h in HOSTS if h not in untested}
    test.untested = dict(untested)
    failed = {(b.source, b.target): b.error for b in blocked}
    test.pairs = {s: {t: ({"ok": False, "error": failed[s, t]} if (s, t) in failed
                          else {"ok": True}) for t in test.ports if t != s}
                  for s in test.ports}
    test._judge()
    return test.result


@pytest.mark.parametrize("blocked", [
    cut("node2"), [Blocked("node3", o, "x") for o in ("node1", "node2")],
    [Blocked("node1", "node2", "x")], [], [*cut("node1"), Blocked("node2", "node3", "x")],
    [Blocked("node1", "node3", "refused"), Blocked("node2", "node3", "timed out")]])
def test_the_hubs_rule_is_checks_rule(blocked: list[Blocked]) -> None:
    """The detached hub (host side: no preflight import there) blames as `check` does, and
    its report says what the controller's says, line for line: the same host blamed, the
    other hosts folded alike (``node[1,3]``), the same record."""
    triples = [(b.source, b.target, b.error) for b in blocked]
    assert linkrule.blamed(HOSTS, triples) == mesh.blamed(Pairs(HOSTS, blocked, {}))
    controller = judge(links.Links(HOSTS, blocked, ADDRESSES))
    assert hub_judges(blocked, {}) == controller
    assert controller[0], controller  # a root cause or "links fine": never nothing


def test_the_hub_and_the_controller_say_an_untested_host_alike() -> None:
    untested = {"node3": "cannot listen on an ephemeral port of 10.79.0.3: refused"}
    blocked = [Blocked("node1", "node2", "timed out after 5 s"),
               Blocked("node2", "node1", "timed out after 5 s")]
    controller = judge(links.Links(HOSTS[:2], blocked, ADDRESSES, untested))
    assert hub_judges(blocked, untested) == controller
    assert controller[0][-1] == ("stall: links of node3 not tested: cannot listen on an "
                                 "ephemeral port of 10.79.0.3: refused"), controller


class FakeConn:
    def __init__(self, sent: list[dict[str, Any]]) -> None:
        self.sent = sent

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


class FakeHub:
    """The hub's side of the gang as linkwatch sees it: names, peers, their connections."""

    def __init__(self, peers: list[str]) -> None:
        self.name = "node1"
        self.peers = dict.fromkeys(peers, "connected")
        self.outbox: dict[str, list[dict[str, Any]]] = {p: [] for p in peers}
        self.conns = {p: FakeConn(self.outbox[p]) for p in peers}

    def broadcast(self, msg: dict[str, Any]) -> None:
        for conn in self.conns.values():
            conn.send(msg)

    def tell(self, peer: str, msg: dict[str, Any]) -> bool:
        self.conns[peer].send(msg)
        return True


class FakePeerLink:
    """A peer's gang link: its socket's own address, and what it sends to the hub."""

    def __init__(self, address: str) -> None:
        self.sent: list[dict[str, Any]] = []
        sock = type("Sock", (), {"getsockname": lambda _self: (address, 40000)})()
        self.conn = type("Conn", (), {"sock": sock})()

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


def test_the_hub_blames_a_peer_silent_over_the_gang_and_not_one_that_answers() -> None:
    """node2 answers the hub's test (real sockets on loopback); node3's gang link carries
    nothing, so it never answers: the hub's pair to it fails, and it is blamed."""
    hub = FakeHub(["node2", "node3"])
    test = linkwatch.HubTest(hub, "127.0.0.1", time.monotonic())
    peer, link = linkwatch.PeerSide(), FakePeerLink("127.0.0.2")
    try:
        deadline = time.monotonic() + 30
        while test.result is None:
            assert time.monotonic() < deadline
            for msg in hub.outbox["node2"]:  # the hub's messages reach node2 only
                peer.on_message(link, msg)
            hub.outbox["node2"].clear()
            peer.tick(link, time.monotonic())
            for msg in link.sent:
                test.on_message("node2", msg)
            link.sent.clear()
            test.tick(time.monotonic())
            time.sleep(0.05)
    finally:
        peer.close()
    lines, record, blamed = test.result
    assert blamed == "node3", lines
    assert record["failed"] == [{"source": "node1", "target": "node3",
                                 "error": "no answer over its connection to the master"}]
    assert lines == ["stall: root cause: node3's links fail: node1 cannot connect to node3 (?) "
                     "on an ephemeral port: no answer over its connection to the master"]


def test_a_peer_that_cannot_listen_is_untested_not_blamed() -> None:
    hub = FakeHub(["node2"])
    test = linkwatch.HubTest(hub, "127.0.0.1", time.monotonic())
    peer, link = linkwatch.PeerSide(), FakePeerLink(UNBINDABLE)
    for msg in hub.outbox["node2"]:
        peer.on_message(link, msg)
    for msg in link.sent:
        test.on_message("node2", msg)
    deadline = time.monotonic() + 30
    while test.result is None:
        assert time.monotonic() < deadline
        test.tick(time.monotonic())
        time.sleep(0.05)
    lines, record, blamed = test.result
    assert blamed is None and record["untested"]["node2"].startswith(
        f"cannot listen on an ephemeral port of {UNBINDABLE}"), record
    assert lines[-1].startswith("stall: links of node2 not tested: cannot listen"), lines


def test_a_blind_stall_stops_at_the_master_and_blames_no_host(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No stack could be read and the links are fine: the master ends the run, and its
    failure says no host can be named, so nothing records or replaces the master."""
    from clusterrun.wire import RootCause

    ranks = [RankStack(r, HOSTS[r // 2], 1000 + r, (), error="no py-spy on this host")
             for r in range(6)]
    sent, said, retested = fire(monkeypatch, tmp_path, ranks, [])
    node, stop = sent[-1]
    assert retested and node is None and stop["fail"], sent
    assert said[0].endswith("no rank's stack could be read, so no rank or host can be named as "
                            "the cause"), said
    cause = RootCause("node1", None, 7, f"node1: {stop['detail']}")
    assert cause.stalled and cause.blamed_node is None, cause


def test_a_report_still_being_made_when_the_attempt_ends_stays_unsaid(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The stacks the master's decider asked for are collected on a thread of their own: when
    the attempt ends while they are still being collected, nothing is printed, recorded or sent
    afterwards."""
    import threading

    collecting, release = threading.Event(), threading.Event()

    def slow_collect(run: RunDir, ssh: SshOptions) -> Collected:
        collecting.set()
        release.wait(10)
        return Collected("r", [waiting(r, HOSTS[r // 2]) for r in range(6)])

    monkeypatch.setattr(stallview, "collect", slow_collect)
    monkeypatch.setattr(links, "retest", lambda run, ssh: links.Links(HOSTS, [], ADDRESSES))
    heard: list[object] = []
    view = stallview.StallView(RunDir(tmp_path), HOSTS, 8, SshOptions(), master="node1",
                               send=lambda node, op: heard.append(op), say=heard.append,
                               record=heard.append)
    busy = view.ask(protocol.Lifeline.STACKS)
    assert collecting.wait(10)
    view.close()  # the attempt ended
    release.set()
    busy.join(10)
    assert not busy.is_alive() and heard == []


def test_the_decider_gets_an_answer_when_the_controller_cannot_ask_the_hosts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The master's decider waits for the stacks and the link test it asked the controller
    for: when the controller cannot ask the hosts (the run's folder unreadable, say), the answer
    says so, and the report made of it is blind and the links untested, never a wait forever."""
    def unreadable(run: RunDir, ssh: SshOptions) -> Collected:
        raise OSError(13, "Permission denied", str(tmp_path / "plan.json"))

    monkeypatch.setattr(stallview, "collect", unreadable)
    monkeypatch.setattr(links, "retest", unreadable)
    sent: list[dict[str, Any]] = []
    view = stallview.StallView(RunDir(tmp_path), HOSTS, 8, SshOptions(), master="node1",
                               send=lambda node, op: sent.append(op), say=print,
                               record=print)
    for what in (protocol.Lifeline.STACKS, protocol.Lifeline.LINKS):
        busy = view.ask(what)
        busy.join(10)
        assert not busy.is_alive()
    stacks, tested = sent
    lines, record = stallreach.collected(stacks, 8)
    assert record.get("blind") and "Permission denied" in stacks["problems"]["node2"], lines
    more, _record, blamed = judge(links.Links(tested["hosts"], tested["blocked"],
                                              untested=tested["untested"]))
    assert blamed is None and "Permission denied" in more[-1], more
