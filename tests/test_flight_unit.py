"""torch's Flight Recorder read back (remote/shared/flight.py): which rank fell behind its process
group, from dumps torch itself wrote, and a dump asked for through a rank's pipe while the job runs.

tests/fakes/flight-recorder/ holds real dumps: torch 2.13's Flight Recorder of a 3-rank Gloo job
(``_dump_fr_trace``, collectives on, stack traces off), in which ranks 0 and 1 entered a fifth
collective (all_reduce) that rank 2 never joined; rank 2's last is the broadcast, #4. NCCL's
dumps have the same format; no GPU was used to make these."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from clusterrun.plan.environment import flight_recorder
from clusterrun.remote.hostlib import flightpipe, pystack
from clusterrun.remote.node import progress, stallreach, stallwatch
from clusterrun.remote.shared import flight, stallreport, stallrule
from clusterrun.stacks import model, stallview, view
from clusterrun.stacks.model import Collected, Frame, RankStack, Thread
from tests.clocks import seconds
from tests.conftest import REPO


def attached_report(found: Collected, timeout: float) -> tuple[list[str], dict[str, Any]]:
    """An attached run's report: the stacks its controller collected, as it sends them to the
    master's decider (stacks/stallview.py), and the report made of them there."""
    return stallreach.collected(stallview.stacks_op(found), timeout)  # type: ignore[no-any-return,no-untyped-call]


RECORDED = REPO / "tests" / "fakes" / "flight-recorder"


def rundir(tmp_path: Path) -> Path:
    for dump in RECORDED.glob("flight-rank-*"):
        shutil.copy(dump, tmp_path / dump.name)
    return tmp_path


def test_the_rank_behind_its_group_is_named_from_torchs_own_dumps(tmp_path: Path) -> None:
    records = flight.flight(str(rundir(tmp_path)))
    assert [(r["rank"], r["seq"], r["collective"]) for r in records] == [
        ("0", 5, "gloo:all_reduce"), ("1", 5, "gloo:all_reduce"), ("2", 4, "gloo:broadcast")]
    # torch's pg_status: rank 2 completed all it entered; ranks 0 and 1 wait in #5.
    assert records[2]["groups"] == {"default_pg": {"seq": 4, "collective": "gloo:broadcast",
                                                   "state": "scheduled", "completed": 4,
                                                   "open": False}}
    assert [flight.waiting(r) for r in records] == [True, True, False]
    nodes = {"0": "gpu-a", "1": "gpu-a", "2": "gpu-b"}
    found = Collected("r", [], flight=[dict(r, node=nodes[r["rank"]]) for r in records])
    late = flight.behind(found.flight)
    assert [(x["rank"], x["node"], x["group"], x["seq"]) for x in late] == [
        ("2", "gpu-b", "default_pg", 4)]
    assert ("  flight recorder: rank 2 (gpu-b) is behind in default_pg: it last entered "
            "gloo:broadcast #4, the others got to gloo:all_reduce #5") in view.render(found)


def test_an_even_group_names_nobody(tmp_path: Path) -> None:
    folder = rundir(tmp_path)
    (folder / "flight-rank-2").unlink()
    records = flight.flight(str(folder))
    assert flight.behind(records) == []


def test_a_dump_is_asked_for_through_the_ranks_pipe(tmp_path: Path) -> None:
    """As torch does: the rank holds its pipe open for reading (non-blocking) and dumps when
    anything arrives. A pipe nobody reads (the rank is gone) is left out at once; a rank that
    reads and writes no dump is asked, but ``ask`` (the stall watchdog's) leaves it out."""
    pipe = tmp_path / "flight-pipe-rank-3.pipe"
    os.mkfifo(pipe)
    os.mkfifo(tmp_path / "flight-pipe-rank-4.pipe")  # no reader
    os.mkfifo(tmp_path / "flight-pipe-rank-5.pipe")
    mute = os.open(tmp_path / "flight-pipe-rank-5.pipe", os.O_RDONLY | os.O_NONBLOCK)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    stop = threading.Event()

    def rank() -> None:
        while not stop.is_set():
            try:
                data = os.read(reader, 64)
            except BlockingIOError:
                data = b""
            if data:
                shutil.copy(RECORDED / "flight-rank-2", tmp_path / "flight-rank-3")
            stop.wait(0.05)

    worker = threading.Thread(target=rank)
    worker.start()
    try:
        assert flightpipe.request(str(tmp_path), wait=1.5) == ["3", "5"]
        assert flightpipe.ask(str(tmp_path), wait=1.5) == ["3"]
    finally:
        stop.set()
        worker.join()
        os.close(reader)
        os.close(mute)
    assert [r["rank"] for r in flight.flight(str(tmp_path))] == ["3"]


def test_the_pipe_is_armed_with_the_rest_on_gpu_hosts() -> None:
    armed = flight_recorder({}, "/w/runs/r1/gpu-a", gpus=True)
    assert armed["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/w/runs/r1/gpu-a/flight-pipe-rank-"
    assert flight_recorder({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x"}, "/w", gpus=True) == {}


def recorded(rank: int) -> dict[str, Any]:
    loaded: dict[str, Any] = pickle.loads((RECORDED / f"flight-rank-{rank}").read_bytes())
    return loaded


def moved_on(dump: dict[str, Any], by: int) -> dict[str, Any]:
    """``dump`` as the rank would write it ``by`` collectives later: every record and number on."""
    out = copy.deepcopy(dump)
    for entry in out["entries"]:
        entry["collective_seq_id"] += by
        entry["record_id"] += by
    for status in out["pg_status"].values():
        for name in ("last_enqueued_collective", "last_completed_collective"):
            status[name] += by
    return out


def test_a_json_dump_reads_as_the_pickled_one(tmp_path: Path) -> None:
    """TORCH_NCCL_USE_JSON: the same fields, pg_status's numbers as text."""
    dump = recorded(0)
    for status in dump["pg_status"].values():
        status.update({k: str(v) for k, v in status.items()})
    (tmp_path / "flight-rank-0").write_text(json.dumps(dump))
    [record] = flight.flight(str(tmp_path))
    assert record["groups"]["default_pg"] == {"seq": 5, "collective": "gloo:all_reduce",
                                              "state": "scheduled", "completed": 4, "open": True}


class Torch:
    """The ranks' side of a round: each rank asked writes its dump (``dumps``) into the run's
    folder, as torch does when its pipe is written to; ``None``: it answers nothing."""

    def __init__(self, rundir: Path, dumps: dict[int, dict[str, Any] | None]) -> None:
        self.rundir = rundir
        self.dumps = dumps
        self.rounds = 0
        for rank in dumps:
            os.mkfifo(rundir / f"flight-pipe-rank-{rank}.pipe")

    def ask(self, rundir: str, wait: float = 5.0) -> list[str]:
        assert rundir == str(self.rundir)
        self.rounds += 1
        for rank, dump in self.dumps.items():
            if dump is not None:
                (self.rundir / f"flight-rank-{rank}").write_bytes(pickle.dumps(dump))
        return [str(r) for r, d in sorted(self.dumps.items()) if d is not None]


def spinning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: float) -> progress.Progress:
    """A node of two ranks (0 and 1) that print nothing, move no byte and keep a core busy each:
    NCCL's waiters in a CUDA synchronisation, or two ranks computing. No py-spy: their stacks
    (often the script's own ``loss.item()`` line on a GPU) would not tell either."""
    (tmp_path / "rank-0.log").write_text("rank 0 step 1\n")
    pids = {0: os.getpid(), 1: os.getppid()}
    monkeypatch.setattr(pystack, "find_ranks", lambda rundir, roots: dict(pids))
    ticks = dict.fromkeys(pids.values(), 0)

    def cpu(pid: int) -> int:
        ticks[pid] += 100  # a whole core between two looks a second apart
        return ticks[pid]

    monkeypatch.setattr(pystack, "cpu_ticks", cpu)
    monkeypatch.setattr(pystack, "io_bytes", lambda pid: 1000)
    monkeypatch.setattr(pystack, "in_io_wait", lambda pid: False)
    return progress.Progress(str(tmp_path), lambda: list(pids.values()), None, timeout=timeout)


def quiet_over(found: progress.Progress, t0: float, span: range) -> list[float]:
    """Look once a second (each round of dumps let finish before the next look)."""
    out = []
    for second in span:
        found.look(t0 + second)
        found.flight.wait()
        out.append(found.quiet(t0 + second))
    return out


def test_ranks_spinning_in_an_open_collective_that_never_moves_stall(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_base: float) -> None:
    """Ranks 0 and 1 entered all_reduce #5 (open) and stay there, spinning: after half the
    timeout of busy CPU alone their dumps are asked for, twice the same, so they are stuck
    since the first round and the node is quiet from then on: a stall about 1.5 timeouts after
    the last line. When their collective completes and the next starts, they move again."""
    torch = Torch(tmp_path, {0: recorded(0), 1: recorded(1)})
    monkeypatch.setattr(flightpipe, "ask", torch.ask)
    found = spinning(tmp_path, monkeypatch, timeout=8.0)
    t0 = clock_base + 100
    quiet = quiet_over(found, t0, range(14))
    # 0: the log is new; busy CPU is progress until round 1 (at 4 s) and round 2 (at 8 s)
    # agree: stuck since 4 s.
    assert quiet == seconds([0] * 9 + [5, 6, 7, 8, 9])
    assert torch.rounds == 3  # at 4, 8 and 12 s: every half timeout, not every look
    assert stallrule.stalled({"gpu-a": quiet[12]}, 8.0)
    torch.dumps = {0: moved_on(recorded(0), 1), 1: moved_on(recorded(1), 1)}
    assert quiet_over(found, t0, range(14, 18)) == seconds([10, 11, 12, 0])  # round at 16 s


def test_a_stuck_rank_that_stops_spinning_stays_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock_base: float) -> None:
    """No busy CPU, no more rounds: the verdict runs out, but the CPU it judged stays judged."""
    torch = Torch(tmp_path, {0: recorded(0), 1: recorded(1)})
    monkeypatch.setattr(flightpipe, "ask", torch.ask)
    found = spinning(tmp_path, monkeypatch, timeout=8.0)
    t0 = clock_base + 100
    assert quiet_over(found, t0, range(14))[-1] == seconds(9)  # stuck since 4 s
    monkeypatch.setattr(pystack, "cpu_ticks", lambda pid: 5)  # blocked now, not spinning
    assert quiet_over(found, t0, range(14, 40)) == seconds(range(10, 36))
    assert torch.rounds == 3


@pytest.mark.parametrize("case", ["moving", "nothing open", "no dumps"])
def test_busy_ranks_stay_progress_unless_their_recorder_shows_them_stuck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, clock_base: float) -> None:
    """Their collectives move on between rounds (a silent job training); every collective they
    entered completed (computing between two, like rank 2 of the recorded job); or the ranks
    answer no round (their torch does not dump): the busy CPU is progress, as without a Flight
    Recorder."""
    late = recorded(2)  # completed all it entered, #4
    dumps: dict[int, dict[str, Any] | None] = {
        "moving": {0: recorded(0), 1: recorded(1)},
        "nothing open": {0: late, 1: late},
        "no dumps": {0: None, 1: None}}[case]
    torch = Torch(tmp_path, dumps)
    if case == "moving":
        def ask(rundir: str, wait: float = 5.0) -> list[str]:
            torch.dumps = {r: moved_on(d, 1) for r, d in torch.dumps.items() if d is not None}
            return torch.ask(rundir, wait)
        monkeypatch.setattr(flightpipe, "ask", ask)
    else:
        monkeypatch.setattr(flightpipe, "ask", torch.ask)
    found = spinning(tmp_path, monkeypatch, timeout=8.0)
    t0 = clock_base + 100
    assert quiet_over(found, t0, range(30)) == seconds([0] * 30)
    assert torch.rounds == 7  # asked all along, every 4 s


def test_a_line_printed_ends_the_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       clock_base: float) -> None:
    """Output is progress: a node printing more often than half the timeout is never asked."""
    torch = Torch(tmp_path, {0: recorded(0), 1: recorded(1)})
    monkeypatch.setattr(flightpipe, "ask", torch.ask)
    found = spinning(tmp_path, monkeypatch, timeout=8.0)
    t0 = clock_base + 100
    for second in range(20):
        if second % 3 == 0:
            with open(tmp_path / "rank-0.log", "a") as log:
                log.write(f"rank 0 step {second}\n")
        found.look(t0 + second)
        found.flight.wait()
        assert found.quiet(t0 + second) == seconds(0)
    assert torch.rounds == 0


def same_place(number: int, node: str) -> RankStack:
    """Every rank's main thread in the script's own line: NCCL's waiters and the rank that is
    late there look alike."""
    main = Thread("MainThread", (Frame("<module>", "/job/train.py", 40),
                                 Frame("train_step", "/job/train.py", 33)), True)
    return RankStack(number, node, 1000 + number, (main,), state="R",
                     last_line=f"rank {number} step 4")


def test_the_rank_behind_is_the_stalls_odd_one_out(tmp_path: Path) -> None:
    """The same stacks everywhere name nobody; the recorded dumps name rank 2, on the
    controller (an attached run) and on the hub (a detached run: each host's ranks carry their
    own dumps over the gang)."""
    records = flight.flight(str(rundir(tmp_path)))
    nodes = {"0": "gpu-a", "1": "gpu-a", "2": "gpu-b"}
    ranks = [same_place(n, nodes[str(n)]) for n in (0, 1, 2)]
    lines, record = attached_report(Collected("r", ranks), 8)
    assert record["odd"] == [] and record["waiting"]["ranks"] == [0, 1, 2]
    with_flight = Collected("r", ranks, flight=[dict(r, node=nodes[r["rank"]]) for r in records])
    lines, record = attached_report(with_flight, 8)
    assert lines[1] == ("stall: odd one out: rank 2 on gpu-b (pid 1002) in train_step "
                        "(train.py:33); last line: 'rank 2 step 4'")
    assert lines[2] == ("stall:   flight recorder: rank 2 is behind in default_pg: it last "
                        "entered gloo:broadcast #4, the others got to gloo:all_reduce #5")
    assert lines[3] == "stall: ranks 0-1 (gpu-a) wait in train_step (train.py:33)"
    assert stallreport.odd_node(record) == "gpu-b"

    # The hub: each host's stacks with its ranks' dumps attached (progress.Dumper).
    sent = {}
    for node, numbers in (("gpu-a", (0, 1)), ("gpu-b", (2,))):
        folder = tmp_path / node
        folder.mkdir()
        for n in numbers:
            shutil.copy(RECORDED / f"flight-rank-{n}", folder / f"flight-rank-{n}")
        found = [dict(model.as_sent(r), node=None) for r in ranks if r.rank in numbers]
        progress.attach_flight(found, str(folder))  # type: ignore[no-untyped-call]
        sent[node] = progress.compact(found)  # type: ignore[no-untyped-call]
    hub_lines, hub = stallwatch.report(sent, 8)  # type: ignore[no-untyped-call]
    assert hub_lines[1:4] == lines[1:4] and hub["odd_node"] == "gpu-b"


def test_a_group_all_in_the_same_open_collective_names_nobody(tmp_path: Path) -> None:
    """Every rank entered all_reduce #5 and none completed it: nobody is behind, so nobody is
    named (the links are tested next, as for Gloo)."""
    even = [dict(flight.flight(str(rundir(tmp_path)))[0], rank=str(n), node="gpu-a")
            for n in (0, 1, 2)]
    lines, record = attached_report(
        Collected("r", [same_place(n, "gpu-a") for n in (0, 1, 2)], flight=even), 8)
    assert record["odd"] == []
    assert lines[1] == "stall: ranks 0-2 (gpu-a) wait in train_step (train.py:33)"
