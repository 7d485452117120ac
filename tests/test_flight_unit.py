"""torch's Flight Recorder read back (remote/flight.py): which rank fell behind its process group,
from dumps torch itself wrote, and a dump asked for through a rank's pipe while the job runs.

tests/fakes/flight-recorder/ holds real dumps: torch 2.13's Flight Recorder of a 3-rank Gloo job
(``_dump_fr_trace``, collectives on, stack traces off), in which ranks 0 and 1 entered a fifth
collective (all_reduce) that rank 2 never joined; rank 2's last is the broadcast, #4. NCCL's
dumps have the same format; no GPU was used to make these."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from clusterrun.plan.environment import flight_recorder
from clusterrun.remote import flight
from clusterrun.stacks import view
from clusterrun.stacks.model import Collected
from tests.conftest import REPO

RECORDED = REPO / "tests" / "fakes" / "flight-recorder"


def rundir(tmp_path: Path) -> Path:
    for dump in RECORDED.glob("flight-rank-*"):
        shutil.copy(dump, tmp_path / dump.name)
    return tmp_path


def test_the_rank_behind_its_group_is_named_from_torchs_own_dumps(tmp_path: Path) -> None:
    records = flight.flight(str(rundir(tmp_path)))  # type: ignore[no-untyped-call]
    assert [(r["rank"], r["seq"], r["collective"]) for r in records] == [
        ("0", 5, "gloo:all_reduce"), ("1", 5, "gloo:all_reduce"), ("2", 4, "gloo:broadcast")]
    assert records[2]["groups"] == {"default_pg": {"seq": 4, "collective": "gloo:broadcast",
                                                   "state": "scheduled"}}
    nodes = {"0": "gpu-a", "1": "gpu-a", "2": "gpu-b"}
    found = Collected("r", [], flight=[dict(r, node=nodes[r["rank"]]) for r in records])
    late = flight.behind(found.flight)  # type: ignore[no-untyped-call]
    assert [(x["rank"], x["node"], x["group"], x["seq"]) for x in late] == [
        ("2", "gpu-b", "default_pg", 4)]
    assert ("  flight recorder: rank 2 (gpu-b) is behind in default_pg: it last entered "
            "gloo:broadcast #4, the others got to gloo:all_reduce #5") in view.render(found)


def test_an_even_group_names_nobody(tmp_path: Path) -> None:
    folder = rundir(tmp_path)
    (folder / "flight-rank-2").unlink()
    records = flight.flight(str(folder))  # type: ignore[no-untyped-call]
    assert flight.behind(records) == []  # type: ignore[no-untyped-call]


def test_a_dump_is_asked_for_through_the_ranks_pipe(tmp_path: Path) -> None:
    """As torch does: the rank holds its pipe open for reading (non-blocking) and dumps when
    anything arrives. A pipe nobody reads (the rank is gone) is left out at once."""
    pipe = tmp_path / "flight-pipe-rank-3.pipe"
    os.mkfifo(pipe)
    os.mkfifo(tmp_path / "flight-pipe-rank-4.pipe")  # no reader
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
        assert flight.request(str(tmp_path), wait=10) == ["3"]  # type: ignore[no-untyped-call]
    finally:
        stop.set()
        worker.join()
        os.close(reader)
    assert [r["rank"] for r in flight.flight(str(tmp_path))] == ["3"]  # type: ignore[no-untyped-call]


def test_the_pipe_is_armed_with_the_rest_on_gpu_hosts() -> None:
    armed = flight_recorder({}, "/w/runs/r1/gpu-a", gpus=True)
    assert armed["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/w/runs/r1/gpu-a/flight-pipe-rank-"
    assert flight_recorder({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x"}, "/w", gpus=True) == {}
