"""A node's state.json through its field table (remote/shared/nodestate.py) and a rundir's file
names (remote/shared/layout.py): what the supervisor writes, every host program reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterrun.remote.hostlib import procs
from clusterrun.remote.shared import layout, nodestate


def test_fields_merge_into_one_file_read_back_typed(tmp_path: Path) -> None:
    assert nodestate.read(str(tmp_path)) is None
    nodestate.write(str(tmp_path), state="running", supervisor_pid=12, torchrun_pid=13,
                    torchrun_start=99, cgroup="")
    nodestate.write(str(tmp_path), stall={"lines": ["stall: ..."]})
    found = nodestate.read(str(tmp_path))
    assert found is not None
    assert (found.state, found.supervisor_pid, found.torchrun_pid, found.torchrun_start,
            found.cgroup, found.ended, found.stall) == (
        "running", 12, 13, 99, None, False, {"lines": ["stall: ..."]})
    assert json.loads((tmp_path / "state.json").read_text())["state"] == "running"
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600


def test_a_name_outside_the_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ended"):
        nodestate.write(str(tmp_path), ended=True)
    assert nodestate.read(str(tmp_path)) is None


def test_wrong_types_read_as_missing_and_a_gone_supervisor_as_lost() -> None:
    odd = nodestate.Snapshot({"state": 3, "supervisor_pid": True, "torchrun_pid": "12",
                              "stall": [1]})
    assert (odd.state, odd.supervisor_pid, odd.torchrun_pid, odd.stall) == (None, None, None, None)
    gone = procs.observed(nodestate.Snapshot({"state": "running", "supervisor_pid": 1,
                                              "supervisor_start": -1}))
    assert (gone.state, gone.raw["reason"]) == ("lost", nodestate.LOST_REASON)
    ended = nodestate.Snapshot({"state": "failed", "ended_at": 5.0, "exit_code": 1})
    assert procs.observed(ended) is ended
    assert ended.final() == {"state": "failed", "exit_code": 1, "reason": None, "cause": None,
                             "ranks": None, "root_cause": None, "ended_at": 5.0}


def test_a_rank_is_read_back_from_its_files_name() -> None:
    assert layout.rank_log(3) == "rank-3.log" and layout.rank_exit(12) == "rank-12.exit"
    assert [layout.rank_of(n) for n in ("rank-3.log", "rank-12.log", "node.log", "rank-.log",
                                        "rank-3.exit", "rank-x.log", "rank-².log")] == [
        3, 12, None, None, None, None, None]
    assert layout.rank_of("rank-3.exit", layout.EXIT) == 3
    assert layout.rank_of(".rank-3.exit", layout.EXIT) is None  # rank.sh's half-written one


def test_rank_sh_writes_the_files_layout_names() -> None:
    """rank.sh is shell text (remote/node/spawn.py): its file names are layout.py's."""
    from clusterrun.remote.node import spawn

    for name in (layout.rank_log(7), layout.rank_exit(7)):
        shell = name.replace("7", "$RANK")
        assert f'"$CLUSTERRUN_RUNDIR/{shell}"' in spawn.RANK_WRAPPER
