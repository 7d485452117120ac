"""The pure parts of `stacks` and the stall watchdog: grouping, the stall rule, the report's
words, and what `check` says about a host where stacks cannot be taken."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from clusterrun.inventory import HostSpec
from clusterrun.preflight import stacks as stack_checks
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.report import Check
from clusterrun.remote.node import stallreach
from clusterrun.remote.shared import stallreport, stallrule
from clusterrun.stacks import stallview, view
from clusterrun.stacks.model import Collected, Frame, RankStack, Thread
from tests.conftest import host_spec


def report(found: Collected, timeout: float) -> tuple[list[str], dict[str, Any]]:
    """An attached run's report: the stacks its controller collected, as it sends them to the
    master's decider (stacks/stallview.py), and the report made of them there."""
    return stallreach.collected(stallview.stacks_op(found), timeout)  # type: ignore[no-any-return,no-untyped-call]


def host_checks(spec: HostSpec, facts: dict[str, Any]) -> list[Check]:
    """stacks.host_checks on the facts as a probe would send them."""
    return stack_checks.host_checks(spec, HostFacts.from_json(facts))


TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def rank(number: int, node: str, *frames: tuple[str, str, int], state: str = "S") -> RankStack:
    main = Thread("MainThread", tuple(Frame(f, p, n) for f, p, n in frames))
    return RankStack(number, node, 1000 + number, (main,), state=state,
                     last_line=f"rank {number} step 2")


def waiting(number: int, node: str) -> RankStack:
    return rank(number, node, ("<module>", "/job/train.py", 49), ("all_reduce", TORCH, 3252))


def test_the_odd_rank_out_comes_first_and_the_waiting_group_last() -> None:
    ranks = [waiting(r, f"node{r // 2 + 1}") for r in (0, 1, 2, 3, 4, 6, 7)]
    ranks.append(rank(5, "node3", ("<module>", "/job/train.py", 44),
                      ("load_batch", "/job/data.py", 30)))
    found = Collected("run-1", sorted(ranks, key=lambda r: r.rank))
    groups = view.groups(found)
    assert [g.label for g in groups] == ["rank 5 (node3)", "ranks 0-4,6-7 (node[1-4])"]
    text = view.render(found)
    assert text[2] == "odd one out: rank 5 (node3): load_batch (data.py:30)"
    assert text[3] == "  rank 5 (node3, pid 1005) last line: 'rank 5 step 2'"
    assert "ranks 0-4,6-7 (node[1-4]): waiting in all_reduce" in text
    lines, record = report(found, 10)
    assert lines[1].startswith("stall: odd one out: rank 5 on node3 (pid 1005) in load_batch")
    assert lines[2] == "stall: ranks 0-4,6-7 (node[1-4]) wait in all_reduce"
    assert record["odd"][0]["rank"] == 5 and record["waiting"]["in"] == "all_reduce"


def test_a_stopped_rank_is_marked() -> None:
    found = Collected("r", [waiting(0, "a"), rank(1, "b", ("<module>", "/job/t.py", 3),
                                                  state="T")])
    assert "STOPPED" in "\n".join(view.render(found))
    assert "STOPPED (SIGSTOP)" in report(found, 5)[0][1]


def test_the_stall_rule() -> None:
    assert stallrule.stalled({"a": 11.0, "b": 10.0}, 10)
    assert not stallrule.stalled({"a": 11.0, "b": 9.9}, 10)  # one node still moves
    assert not stallrule.stalled({"a": 11.0, "b": None}, 10)  # not heard from yet
    assert not stallrule.stalled({"a": 99.0}, 0)  # the watchdog is off
    assert not stallrule.stalled({}, 10)


def test_check_warns_where_stacks_cannot_be_taken() -> None:
    spec = host_spec("10.0.0.5", "gpu-a")
    normal = {"root": False, "cap_sys_ptrace": False, "pyspy": None}
    assert host_checks(spec, {"ptrace": dict(normal, scope=1)}) == []  # rank.sh's opt-in
    assert host_checks(spec, {"ptrace": dict(normal, scope=None)}) == []  # no Yama
    assert host_checks(spec, {"ptrace": dict(normal, scope=2, root=True)}) == []
    [found] = host_checks(spec, {"ptrace": dict(normal, scope=2)})
    assert found.warning and "kernel.yama.ptrace_scope is 2" in found.detail
    assert "sysctl kernel.yama.ptrace_scope=1" in found.detail
    [found] = host_checks(spec, {"ptrace": dict(normal, scope=3)})
    assert "reboot" in found.detail
    boxed = host_spec("10.0.0.6", "gpu-b")
    boxed = type(boxed)(**{**boxed.__dict__, "container": "trainer"})
    [found] = host_checks(boxed, {"ptrace": dict(normal, scope=0, root=True)})
    assert "--cap-add SYS_PTRACE" in found.detail


def test_the_flight_recorder_is_armed_on_gpu_hosts_only_and_read_back(tmp_path: Path) -> None:
    from clusterrun.plan.environment import flight_recorder
    from clusterrun.remote.shared import flight

    armed = flight_recorder({}, "/w/runs/r1/gpu-a", gpus=True)
    assert armed["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert armed["TORCH_FR_DUMP_TEMP_FILE"] == "/w/runs/r1/gpu-a/flight-rank-"
    assert flight_recorder({}, "/w/runs/r1/cpu", gpus=False) == {}  # Gloo never dumps it
    assert flight_recorder({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, "/w", gpus=True) == {}
    # A dump as torch writes it (pickled; the shape of torch's own dump of a Gloo group here).
    entries = [{"profiling_name": "nccl:all_reduce", "collective_seq_id": n, "state": "completed"}
               for n in (1, 2)] + [{"profiling_name": "nccl:broadcast", "collective_seq_id": 3,
                                    "state": "started"}]
    (tmp_path / "flight-rank-3").write_bytes(pickle.dumps({"entries": entries}))
    (tmp_path / "flight-rank-4").write_bytes(b"half a dump")
    assert flight.flight(str(tmp_path)) == [
        {"rank": "3", "file": "flight-rank-3", "collective": "nccl:broadcast", "seq": 3,
         "state": "started", "entries": 3, "last_id": None, "groups": {"the process group": {
             # no pg_status (torch before 2.5): open by its state alone
             "seq": 3, "collective": "nccl:broadcast", "state": "started", "completed": None,
             "open": True}}}]
    found = Collected("r", [], flight=[dict(flight.flight(str(tmp_path))[0],
                                            node="gpu-a")])
    assert "  flight recorder: rank 3 (gpu-a) last entered nccl:broadcast #3 (started)" in \
        view.render(found)


def test_check_names_a_host_no_py_spy_can_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterrun import pyspy

    spec = host_spec("10.0.0.7", "power-a")
    here = pyspy.Binary("/venv/bin/py-spy", "ab" * 32, 8, "Linux", "x86_64")
    normal = {"root": True, "cap_sys_ptrace": True, "scope": 0, "pyspy": None}
    monkeypatch.setattr(pyspy, "local", lambda: here)
    assert host_checks(spec, {"ptrace": dict(normal, machine="x86_64")}) == []  # shipped there
    assert host_checks(spec, {"ptrace": dict(normal, machine="ppc64le",
                                             pyspy="/venv/bin/py-spy")}) == []  # its own
    [found] = host_checks(spec, {"ptrace": dict(normal, machine="ppc64le")})
    assert found.warning and found.name == "stacks"
    assert found.detail.startswith("warning: power-a: no py-spy for this host (ppc64le)")
    assert "is a Linux (ELF) x86_64 program" in found.detail
    assert "pip install py-spy" in found.detail
    monkeypatch.setattr(pyspy, "local", lambda: None)
    [found] = host_checks(spec, {"ptrace": dict(normal, machine="x86_64")})
    assert "this machine has no py-spy to send" in found.detail
    assert host_checks(spec, {"ptrace": normal}) == []  # an older probe says no machine


def test_a_stall_where_no_stack_could_be_read_names_no_rank() -> None:
    from clusterrun.remote.node import stallwatch as hub

    found = Collected("r", [], problems={"node2": "node2: py-spy is not installed there nor here"})
    lines, record = report(found, 15)
    assert lines[0] == ("stall: no rank made progress for 15 s; no rank's stack could be read, "
                        "so no rank or host can be named as the cause")
    assert lines[1] == "stall: no stacks from node2: node2: py-spy is not installed there nor here"
    assert record["odd"] == [] and record["blind"]
    assert "0 ranks" not in "\n".join(lines)
    # The detached run's hub says the same, per rank, from the errors its peers sent.
    got = {"node1": [{"rank": 0, "pid": 11, "threads": [], "error": "no py-spy on this host",
                      "last_line": "step 3"}], "node2": []}
    said, found = hub.report(got, 15)  # type: ignore[no-untyped-call]
    assert found["odd_node"] is None
    assert said[0].endswith("so no rank or host can be named as the cause")
    assert said[1] == "stall: rank 0 on node1 (pid 11): no py-spy on this host; last line: 'step 3'"
    assert stallreport.stop_detail(said).startswith(
        "stalled, no rank made progress for 15 s; no rank's stack could be read")


def test_the_users_own_line_and_the_dataloader_workers_are_named(tmp_path: Path) -> None:
    from clusterrun.remote.shared import stackrule, userframe
    from clusterrun.stacks.model import from_reply

    train = tmp_path / "train.py"
    train.write_text("import time\n" * 18 + "        time.sleep(3600)\n" + "\n" * 13 +
                     "for step, batch in enumerate(loader):\n")
    site = "/venv/lib/python3.11/site-packages/torch/utils/data"
    module = {"function": "<module>", "file": str(train), "line": 33}
    rank_frames = [module, {"function": "_BaseDataLoaderIter.__next__",
                            "file": f"{site}/dataloader.py", "line": 733},
                   {"function": "_PollLikeSelector.select", "file": "/usr/lib/python3.11/"
                    "selectors.py", "line": 415}]
    # A forked worker still holds the parent's frames (the for line) outside its loop.
    worker_frames = [module, {"function": "_worker_loop", "file": f"{site}/_utils/worker.py",
                              "line": 349},
                     {"function": "Shards.__getitem__", "file": str(train), "line": 19}]
    code = str(tmp_path)
    entry = {"rank": 3, "pid": 40, "threads": [{"name": "MainThread", "active": False,
                                                 "frames": rank_frames}],
             "user": userframe.user_frame(rank_frames, code),
             "children": [{"pid": 41, "label": "DataLoader worker 1", "threads": [
                 {"name": "MainThread", "active": False, "frames": worker_frames}],
                 "user": userframe.user_frame(worker_frames, code, 1)}]}
    # An idle worker (waiting for indices) has no line of its own: the inherited one is not it.
    idle = [*worker_frames[:2], {"function": "Queue.get", "file": "/usr/lib/python3.11/"
                                 "multiprocessing/queues.py", "line": 113}]
    assert userframe.user_frame(idle, code, 1) is None
    assert userframe.user_frame(idle, code)["line"] == 33  # type: ignore[index]
    said = userframe.where(entry)
    assert said == ("rank 3 waits in `for step, batch in enumerate(loader):` (train.py:33), "
                    "inside `_BaseDataLoaderIter.__next__`; DataLoader worker 1 (pid 41) waits "
                    "in `time.sleep(3600)` (train.py:19) in `Shards.__getitem__`")
    assert stackrule.data_wait(rank_frames, False) and not stackrule.waiting_in(entry["threads"])
    # A decorator's frame is not the call the user made: torch wraps its collectives.
    wrapped = [module, {"function": "_exception_logger.<locals>.wrapper", "file": "/venv/lib/"
                        "python3.11/site-packages/torch/distributed/c10d_logger.py", "line": 81},
               {"function": "all_reduce", "file": TORCH, "line": 3252}]
    assert userframe.user_frame(wrapped, code)["call"] == "all_reduce"  # type: ignore[index]
    # The controller shows the line under the odd rank, and the worker's own stack.
    line = userframe.at(entry["user"])
    assert line == "<module> (train.py:33) `for step, batch in enumerate(loader):`"
    rank = from_reply("node2", dict(entry, where=said, at=line, state="S", last_line="step 7"))
    found = Collected("r", [waiting(0, "node1"), rank])
    text = view.render(found)
    assert f"  {said}" in text
    assert f"odd one out: rank 3 (node2): {line}" in text, text
    assert "    DataLoader worker 1 (pid 41):" in text
    assert f"        Shards.__getitem__  {train}:19" in text
    lines, record = report(found, 10)
    assert lines[2] == f"stall:   {said}" and record["odd"][0]["where"] == said
    # The odd rank's own line, and so the root cause a stopped stall records, is the user's
    # line, not the stdlib selector's frame the rank's innermost is.
    assert lines[1] == f"stall: odd one out: rank 3 on node2 (pid 40) in {line}; last line: " \
        "'step 7'", lines
    assert stallreport.stop_detail(lines).startswith(
        f"stalled, odd one out: rank 3 on node2 (pid 40) in {line}")


def test_a_rank_whose_stack_could_not_be_read_is_not_the_odd_one_out() -> None:
    from clusterrun.remote.node import stallwatch as hub

    blind = RankStack(2, "node3", 1002, (), error="no py-spy on this host", last_line="step 2")
    found = Collected("r", [waiting(0, "node1"), waiting(1, "node2"), blind])
    lines, record = report(found, 10)
    assert record["odd"] == [] and not any("odd one out" in x for x in lines), lines
    assert lines[-1] == "stall: no stack from rank 2 on node3 (pid 1002): no py-spy on this host"
    # `stacks` neither: the rank is said after the groups, with its reason.
    text = view.render(found)
    assert not any("odd one out" in x for x in text), text
    assert text[0] == "run r: 3 ranks on 3 nodes, 1 different stack", text
    assert text[-2:] == ["no stack from rank 2 (node3): no py-spy on this host",
                         "  rank 2 (node3, pid 1002) last line: 'step 2'"], text
    # The hub: the same.
    got = {n: [dict(r.to_json(), error=r.error, last_line=r.last_line)] for n, r in
           (("node1", found.ranks[0]), ("node2", found.ranks[1]), ("node3", blind))}
    said, found = hub.report(got, 10)  # type: ignore[no-untyped-call]
    assert found["odd_node"] is None and not any("odd one out" in x for x in said), said
    assert said[-1] == "stall: no stack from rank 2 on node3 (pid 1002): no py-spy on this host"
    # A connected host that sent no stacks in time is said, as the controller says a host
    # that gave none (and, when nothing was seen at all, it is what could not be seen).
    said, _ = hub.report({"node1": got["node1"]}, 10, {"node4"})  # type: ignore[no-untyped-call]
    assert "stall: no stacks from node4: node4: no stacks within 20 s" in said, said
    said, _ = hub.report({}, 10, {"node4"})  # type: ignore[no-untyped-call]
    assert said[1:] == ["stall: no stacks from node4: node4: no stacks within 20 s"], said


def _sent(number: int, frames: list[tuple[str, str, int]], *, active: bool | None = False,
          **extra: object) -> dict[str, object]:
    """One rank as a host's stacks.py sends it (remote/hostlib/pystack.py ``dump_all``)."""
    return {"rank": number, "pid": 2000 + number, "state": "S", "last_line": f"step {number}",
            "threads": [{"name": "Thread-1", "active": True, "frames": [
                {"function": "run", "file": "/usr/lib/python3.11/threading.py", "line": 982}]},
                {"name": "MainThread", "active": active, "frames": [
                    {"function": f, "file": p, "line": n} for f, p, n in frames]}],
            **extra}


ALL_REDUCE = [("<module>", "/job/train.py", 49), ("all_reduce", TORCH, 3252)]
STALLS = {
    "one odd rank": {f"node{n}": [_sent(2 * n - 2, ALL_REDUCE), _sent(2 * n - 1, ALL_REDUCE)]
                     for n in (1, 2, 4)} | {"node3": [
                         _sent(4, ALL_REDUCE), _sent(5, [("<module>", "/job/train.py", 44), (
                             "load_batch", "/job/data.py", 30)], where="rank 5 waits in x")]},
    "stopped and unread": {"gpu01": [_sent(0, ALL_REDUCE), _sent(1, [("<module>", "/j/t.py", 3)],
                                                                  state="T")],
                           "gpu02": [_sent(2, ALL_REDUCE), _sent(3, [], error="no permission")],
                           "gpu10": [_sent(4, ALL_REDUCE)]},
    "all wait": {"a": [_sent(0, ALL_REDUCE)], "b": [_sent(1, ALL_REDUCE)]},
    "one rank": {"a": [_sent(0, [("<module>", "/job/train.py", 7)], active=True)]},
    "blind": {"node1": [_sent(0, [], error="no py-spy on this host")],
              "node2": [_sent(1, [], error="no py-spy on this host")]},
}


@pytest.mark.parametrize("name", sorted(STALLS))
def test_the_controller_and_the_hub_make_the_same_report(name: str) -> None:
    """The same stacks, as the hosts sent them, give the same report on both deciders: an
    attached run's controller (typed stacks, NodeSet's folding) and a detached run's hub (the
    stdlib dicts its peers sent)."""
    from clusterrun.remote.node import stallwatch as hub
    from clusterrun.stacks.model import from_reply

    got = STALLS[name]
    found = Collected("r", sorted((from_reply(node, dict(entry)) for node, entries in got.items()
                                   for entry in entries), key=lambda r: r.rank))
    lines, record = report(found, 7.5)
    said, kept = hub.report(got, 7.5)  # type: ignore[no-untyped-call]
    assert said == lines
    assert {k: kept.get(k) for k in ("odd", "waiting", "blind", "timeout")} == \
        {k: record.get(k) for k in ("odd", "waiting", "blind", "timeout")}
    assert kept["odd_node"] == (record["odd"][0]["node"] if record["odd"] else None)
    assert lines[0].startswith("stall: no rank made progress for 7.5 s; ")


@pytest.mark.parametrize("name", sorted(STALLS))
def test_stacks_groups_the_ranks_as_the_stall_report_does(name: str) -> None:
    """`clusterrun stacks` and the stall report group by one rule: the same groups in the same
    order, the same odd ones out (but a lone rank: `stacks` of a one-rank run calls nothing
    odd), and a rank whose stack could not be read is in no group and no odd one out."""
    from clusterrun.stacks.model import from_reply

    got = STALLS[name]
    found = Collected("r", sorted((from_reply(node, dict(entry)) for node, entries in got.items()
                                   for entry in entries), key=lambda r: r.rank))
    lines, record = report(found, 7.5)
    shown = view.groups(found)
    read = [dict(e, node=n) for n, entries in got.items() for e in entries if not e.get("error")]
    assert [[r.rank for r in g.ranks] for g in shown] == [
        [r["rank"] for r in g] for g in stallreport.groups(read)]
    text = view.render(found)
    tagged = {r.rank for g in shown for r in g.ranks
              if any(x.startswith(f"odd one out: {g.label}: ") for x in text)}
    assert tagged == ({o["rank"] for o in record["odd"]} if len(shown) > 1 else set()), text
    unread = [r for r in found.ranks if r.error]
    for rank in unread:
        assert f"stall: no stack from rank {rank.rank} on {rank.node} (pid {rank.pid}): " \
            f"{rank.error}" in lines or record.get("blind"), lines
        assert any(x.startswith("no stack from ") and x.endswith(f": {rank.error}")
                   for x in text), text
        assert f"  rank {rank.rank} ({rank.node}, pid {rank.pid}) last line: " \
            f"{rank.last_line!r}" in text, text
    assert not {r.rank for r in unread} & tagged
    plural = "" if len(shown) == 1 else "s"
    assert text[0].endswith(f", {len(shown)} different stack{plural}"), text
    if not record.get("blind"):
        assert lines[0].endswith(f", {len(shown)} different stack{plural}"), lines


def test_the_hosts_fold_host_names_as_nodeset_does() -> None:
    from clusterrun.inventory.ranges import fold

    for names in (["node1", "node2", "node3"], ["node9", "node10", "node12"],
                  ["gpu07", "node1", "node2"], ["node01", "node02", "node10"],
                  ["10.79.0.1", "10.79.0.2"], ["a", "b1"], ["x1"]):
        assert stallreport.fold_hosts(names) == fold(names), names


def test_launch_ships_py_spy_once_by_content_to_hosts_without_one(tmp_path: Path) -> None:
    """A watched run's hosts without a py-spy get this machine's before the run starts, under
    <workdir>/runs/.tools by content (where the supervisors look); the probe then reports the
    copy, and the next launch sends nothing."""
    import dataclasses
    import struct
    import sys
    from types import SimpleNamespace

    from clusterrun import pyspy
    from clusterrun.remote.probe import sysinfo
    from clusterrun.stacks import ship
    from clusterrun.transport.local import LocalTransport
    from tests.conftest import LOCAL_SPEC

    fake = tmp_path / "py-spy"  # an x86-64 Linux program's header, and some bytes
    fake.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(8) + struct.pack("<HH", 2, 62)
                     + bytes(range(256)) * 64)
    binary = pyspy.read(str(fake))
    workdir = tmp_path / "w"
    spec = dataclasses.replace(LOCAL_SPEC, workdir=str(workdir), python=sys.executable)
    nodes = [SimpleNamespace(name="n0", local=False,
                             rundir=f"{workdir}/runs/20260101-x/attempt-2/n0")]
    bare = {"ptrace": {"pyspy": None, "machine": "x86_64", "shipped": []}}
    said: list[str] = []

    def launch(facts: dict[str, object], timeout: int = 10) -> list[str]:
        plan = SimpleNamespace(stall_timeout=timeout, nodes=nodes)
        return ship.ship(plan, {"n0": LocalTransport(spec)}, {"n0": spec},  # type: ignore[arg-type]
                         {"n0": facts}, said.append, binary=binary)

    assert launch(bare, timeout=0) == []  # the watchdog is off: nothing to read stacks for
    assert launch({}) == [] and launch({"ptrace": dict(bare["ptrace"], pyspy="/v/py-spy")}) == []
    assert launch({"ptrace": dict(bare["ptrace"], machine="aarch64")}) == []  # cannot run it
    assert not (workdir / "runs").exists()
    assert launch(bare) == ["n0"], said
    copy = workdir / "runs" / ".tools" / f"py-spy-{binary.sha[:16]}"
    assert copy.read_bytes() == fake.read_bytes() and copy.stat().st_mode & 0o777 == 0o700
    # The probe of the next launch reports the copy, and nothing is sent again.
    facts = {"ptrace": sysinfo.ptrace(str(workdir))}  # type: ignore[no-untyped-call]
    assert facts["ptrace"]["shipped"] == [copy.name]
    assert launch(facts) == [] and said == []


def test_stacks_rank_asks_the_node_whose_range_holds_it(tmp_path: Path) -> None:
    """plan.json keeps a node's ranks as [first, last]: `stacks --rank 3` asks the node of
    ranks 0-7, not only a node whose first or last rank is 3."""
    import json

    from clusterrun.runs.store import RunDir
    from clusterrun.stacks.collect import _nodes_for

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    (run.path / "plan.json").write_text(json.dumps({"nodes": [
        {"name": "gpu-a", "host": "10.0.0.1", "node_rank": 0, "ranks": [0, 7]},
        {"name": "gpu-b", "host": "10.0.0.2", "node_rank": 1, "ranks": [8, 15]}]}))
    assert _nodes_for(run, None, {3}) == {"gpu-a"}
    assert _nodes_for(run, None, {7, 8}) == {"gpu-a", "gpu-b"}
    assert _nodes_for(run, None, {16}) == set()


def test_pyspy_digest_remembered_by_file_identity(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launch reads py-spy's digest from $CLUSTERRUN_HOME instead of hashing 8 MB again;
    a binary that changed (size, mtime or inode) is hashed anew, and a home that cannot be
    written costs only the hash."""
    import hashlib

    from clusterrun import pyspy

    home = tmp_path / "home"
    monkeypatch.setenv("CLUSTERRUN_HOME", str(home))
    binary = tmp_path / "py-spy"
    binary.write_bytes(b"\x7fELF" + bytes(range(256)) * 16)
    first = pyspy.read(str(binary), remember=True)
    assert first.sha == hashlib.sha256(binary.read_bytes()).hexdigest()
    kept = home / "cache" / "pyspy.json"
    assert json.loads(kept.read_text())["sha"] == first.sha
    kept.write_text(kept.read_text().replace(first.sha, "f" * 64))  # proves the file is read
    assert pyspy.read(str(binary), remember=True).sha == "f" * 64
    assert pyspy.read(str(binary)).sha == first.sha  # without remember: always hashed

    binary.write_bytes(b"\x7fELF" + bytes(range(256)) * 17)
    changed = pyspy.read(str(binary), remember=True)
    assert changed.sha == hashlib.sha256(binary.read_bytes()).hexdigest() != first.sha

    blocked = tmp_path / "a-file"  # a home under a file: no one, root included, writes there
    blocked.write_text("")
    monkeypatch.setenv("CLUSTERRUN_HOME", str(blocked / "home"))
    assert pyspy.read(str(binary), remember=True).sha == changed.sha
