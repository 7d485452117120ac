"""--node takes a NodeSet and --rank a rank list (`0-3,8`) on every command that selects, each
repeatable; a single name or number still works. `logs --node` took only names and `--rank 0-3`
was "not a valid integer range"."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clusterrun.cli.selectors import parse_ranks
from tests.conftest import run_main

RUN = "20250101-100000-tick-aaaa"


def fake_run(home: Path, run_id: str, name: str, created: float) -> None:
    """A finished run as a launch leaves it here: node0 holds rank 0, node1 rank 1."""
    path = home / "runs" / run_id
    plan = {"run_id": run_id, "name": name, "created": created, "nnodes": 2, "world_size": 2,
            "nodes": [{"name": f"node{i}", "host": "localhost", "node_rank": i, "nproc": 1,
                       "ranks": [i, i], "connection": {}} for i in range(2)]}
    arrivals = []
    for i in range(2):
        folder = path / "nodes" / f"node{i}"
        folder.mkdir(parents=True)
        data = "".join(f"{name} r{i} line {n}\n" for n in range(3)).encode()
        (folder / f"rank-{i}.log").write_bytes(data)
        arrivals.append(f"node{i}\trank-{i}.log\t{len(data)}\n")
    (path / "arrivals").write_text("".join(arrivals))
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "state.json").write_text(json.dumps({"id": run_id, "name": name,
                                                 "state": "succeeded", "started_at": created,
                                                 "ended_at": created + 1}))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    fake_run(home, RUN, "tick", time.time() - 60)
    monkeypatch.setenv("CLUSTERRUN_HOME", str(home))
    return home


def shown(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """The `[node rR` prefixes `logs` prints, one per line."""
    status, out, err = run_main(capsys, "logs", RUN, *args)
    assert status == 0, err
    return sorted({line.split("]")[0] + "]" for line in out.splitlines()})


BOTH = ["[node0 r0]", "[node1 r1]"]


@pytest.mark.parametrize(("args", "lines"), [
    (["--node", "node[0-1]"], BOTH),
    (["--node", "node[1]"], ["[node1 r1]"]),
    (["--node", "node0,node1"], BOTH),
    (["--node", "node0", "--node", "node1"], BOTH),
    (["--node", "node1"], ["[node1 r1]"]),
    (["--rank", "0-1"], BOTH),
    (["--rank", "0,1"], BOTH),
    (["--rank", "1", "--rank", "0"], BOTH),
    (["--rank", "1"], ["[node1 r1]"]),
    (["--rank", "0-1", "--node", "node0"], ["[node0 r0]"]),
])
def test_logs_selects_by_nodeset_and_rank_list(home: Path, capsys: pytest.CaptureFixture[str],
                                               args: list[str], lines: list[str]) -> None:
    assert shown(capsys, *args) == lines


@pytest.mark.parametrize(("command", "args", "says"), [
    ("logs", [RUN, "--rank", "0-3"], "has no rank 2-3; it has ranks 0-1"),
    ("logs", [RUN, "--node", "node[0-2]"], "has no node node2; its nodes: node[0-1]"),
    ("logs", [RUN, "--rank", "0", "--node", "node1"],
     "rank 0 does not run on node1 (node1 holds 1); give ranks of those nodes"),
    ("stacks", [RUN, "--node", "node[1-3]"], "has no node node[2-3]; its nodes: node[0-1]"),
    ("stacks", [RUN, "--rank", "1", "--node", "node0"], "rank 1 does not run on node0"),
    ("stop", [RUN, "--node", "node1"], "--node node1: `stop` ends a run on every host"),
    ("stop", [RUN, "--rank", "0-1"], "--rank 0-1: `stop` ends a run on every host"),
    ("logs", [RUN, "--rank", "x"], "'x' is not a rank list: give ranks and ranges such as 3"),
    ("logs", [RUN, "--rank", "3-1"], "'3-1' in '3-1' runs backwards; write 1-3"),
    ("logs", [RUN, "--node", "node[1-"], "'node[1-' is not a valid host range"),
    ("stacks", [RUN, "--rank", "0,x"], "'0,x' is not a rank list"),
])
def test_selectors_that_do_not_fit_are_usage_errors(
        home: Path, capsys: pytest.CaptureFixture[str], command: str, args: list[str],
        says: str) -> None:
    status, out, err = run_main(capsys, command, *args)
    assert status == 2, (out, err)
    assert err.startswith("clusterrun: error: ") and says in err, err
    assert "Traceback" not in err


def test_rank_lists() -> None:
    assert parse_ranks("3") == [3]
    assert parse_ranks("0-3,8") == [0, 1, 2, 3, 8]
    assert parse_ranks(" 2 , 0-1 ") == [2, 0, 1]
    for bad in ("", "-1", "1-", "a", "1-2-3", "0-99999999"):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_top_shows_the_hosts_and_ranks_picked() -> None:
    from clusterrun.cli.observe import Pick
    from clusterrun.cli.selectors import holding
    from clusterrun.observe.frame import Frame, HostSample, RankSample
    from clusterrun.runs.records import PlanRecord

    plan = PlanRecord.from_json({"world_size": 6, "nodes": [
        {"name": f"node{i}", "host": "h", "ranks": [2 * i, 2 * i + 1]} for i in range(3)]})
    assert holding(plan, (), (1, 2)) == ["node0", "node1"]
    assert holding(plan, ("node2", "node0"), ()) == ["node0", "node2"]
    assert holding(plan, ("node2",), (1, 4)) == ["node2"]
    frame = Frame("r", "running", 1.0, [HostSample(f"node{i}") for i in range(3)],
                  [RankSample(r, f"node{r // 2}") for r in range(6)])
    picked = Pick(frozenset(holding(plan, (), (1, 2))), frozenset({1, 2})).apply(frame)
    assert [h.node for h in picked.hosts] == ["node0", "node1"]
    assert [(r.rank, r.node) for r in picked.ranks] == [(1, "node0"), (2, "node1")]
    whole = Pick(frozenset(holding(plan, ("node1",), ())), frozenset()).apply(frame)
    assert [r.rank for r in whole.ranks] == [2, 3]
