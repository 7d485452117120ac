"""The straggler rule of `stacks --profile` at its edges (two ranks, half the ranks slow, a rank
py-spy barely sampled), and when a profile may be recorded as the run's straggler event."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from clusterrun.runs.journal import Journal, RunRecord, events
from clusterrun.stacks import collect
from clusterrun.stacks.model import Collected, RankStack, from_reply
from clusterrun.stacks.profile import MIN_SAMPLES, lines, stragglers


def ranked(*shares: Optional[float], samples: int = 500) -> list[RankStack]:
    return [RankStack(n, f"node{n}", 100 + n, (), wait_share=s, samples=samples)
            for n, s in enumerate(shares)]


def test_an_even_run_names_nobody_and_one_slow_rank_is_named() -> None:
    assert stragglers(ranked(0.70, 0.66, 0.74, 0.71)) == []
    assert stragglers(ranked(0.70, 0.04, 0.74, 0.71)) == [1]
    assert stragglers(ranked(0.70)) == []  # one rank: nobody to compare with
    assert stragglers(ranked(0.70, None, 0.05)) == [2]  # a rank without a share is left out


def test_two_ranks_are_judged_by_the_gap_between_them() -> None:
    # The median falls halfway: the slower rank is named when they are 50 points or more apart.
    assert stragglers(ranked(0.70, 0.18)) == [1]  # 52 points
    assert stragglers(ranked(0.70, 0.22)) == []  # 48 points: within what even runs show x2


def test_half_the_ranks_slow_are_named_when_far_enough_apart() -> None:
    assert stragglers(ranked(0.72, 0.05, 0.70, 0.04)) == [1, 3]
    assert stragglers(ranked(0.40, 0.05, 0.38, 0.04)) == []  # 35 points: the median sits between
    # More than half slow: the median is a slow rank's, and nobody is named (the doc says so).
    assert stragglers(ranked(0.70, 0.05, 0.04, 0.06)) == []


def test_a_rank_with_too_few_samples_is_never_named_nor_counted() -> None:
    few = ranked(0.70, 0.72, 0.0)
    few[2] = RankStack(2, "node2", 102, (), wait_share=0.0, samples=1)  # one sample, not waiting
    assert stragglers(few) == []
    said = lines(Collected("r", few, stragglers=[]), 5)
    assert "  rank 2    node2               0.0%  (only 1 samples: too few to judge)" in said
    # The median is the judged ranks' only: a barely sampled rank does not move it.
    many = ranked(0.70, 0.72, 0.05)
    many.append(RankStack(3, "node3", 103, (), wait_share=0.0, samples=MIN_SAMPLES - 1))
    many.append(RankStack(4, "node4", 104, (), wait_share=0.0, samples=MIN_SAMPLES - 1))
    assert stragglers(many) == [2]
    # The count travels from the host's answer: one sample out of one.
    entry = {"rank": 0, "pid": 7, "threads": [], "profile": {"samples": 1, "waiting": 0}}
    assert from_reply("node1", entry).samples == 1
    assert stragglers([from_reply("node1", entry), *ranked(0.7, 0.7)[1:]]) == []


def started(tmp_path: Path) -> Journal:
    return Journal.start(tmp_path, RunRecord("20260101-000000-t-0001", "t", ("a", "b"), "i.yaml"),
                         {"run_id": "20260101-000000-t-0001", "name": "t"}, ())


def answers(shares: dict[str, list[float]], samples: int = 500) -> list[Any]:
    """each_node's results: per node, its ranks' profiles as remote/tools/stackdump.py answers."""
    out = []
    rank = 0
    for node, values in shares.items():
        ranks = []
        for value in values:
            ranks.append({"rank": rank, "pid": 100 + rank, "threads": [], "profile": {
                "samples": samples, "waiting": int(value * samples)}})
            rank += 1
        out.append(SimpleNamespace(spec=SimpleNamespace(name=node), failure=None,
                                   value={"found": True, "state": "running", "ranks": ranks}))
    return out


@pytest.mark.parametrize("asked", [
    {"nodes": {"node1"}},  # one host's view says nothing about the run
    {"ranks": {0}},
    {"nodes": {"node1", "node3"}},
])
def test_only_a_profile_of_the_whole_run_is_recorded(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     asked: dict[str, Any]) -> None:
    """The whole run names rank 1; a later profile of hosts without it would otherwise record
    ``straggler ranks: []``, "the run is even again"."""
    journal = started(tmp_path)
    plan = {"nodes": [{"name": "node1", "ranks": [0]}, {"name": "node2", "ranks": [1]},
                      {"name": "node3", "ranks": [2]}]}
    nodes = {"node1": [0.7], "node2": [0.05], "node3": [0.72]}

    replies = {a.spec.name: a.value for a in answers(nodes)}

    def each_node(run: Any, ssh: Any, fn: Any, deadline: Any) -> list[Any]:
        """collect's own per-node function (it skips the nodes not asked), over no network."""
        return [SimpleNamespace(spec=spec, failure=None, value=fn(None, spec, node))
                for node in plan["nodes"] for spec in [SimpleNamespace(name=node["name"])]]

    monkeypatch.setattr(collect, "ask", lambda transport, spec, node, ranks, profile:
                        replies[spec.name])

    monkeypatch.setattr(collect.attempts, "current",
                        lambda run: SimpleNamespace(attempt=1, plan=plan))
    monkeypatch.setattr(collect.remote_runs, "each_node", each_node)
    ssh: Any = SimpleNamespace(connect_timeout=1.0)
    whole = collect.collect(journal.run, ssh, profile=5)
    assert whole.stragglers == [1] and not whole.partial
    found = collect.collect(journal.run, ssh, profile=5, **asked)
    assert found.partial and found.stragglers == []
    got = [e["ranks"] for e in events(journal.run) if e["event"] == "straggler"]
    assert got == [[1]]
    assert "among the ranks asked only" in lines(found, 5)[-1]


def test_a_profile_with_a_barely_sampled_rank_is_not_recorded(tmp_path: Path) -> None:
    journal = started(tmp_path)
    found = Collected("r", ranked(0.7, 0.72, 0.7), stragglers=[])
    found.ranks[1] = RankStack(1, "node1", 101, (), wait_share=0.0, samples=3)
    collect._record(journal.run, 1, found)
    assert [e for e in events(journal.run) if e["event"] == "straggler"] == []
    collect._record(journal.run, 1, Collected("r", ranked(0.7, 0.05, 0.7), stragglers=[1]))
    assert [e["ranks"] for e in events(journal.run) if e["event"] == "straggler"] == [[1]]


C10D = "torch/distributed/distributed_c10d.py"


def raw(*stacks: tuple[str, int]) -> str:
    return "".join(f"thread (7): MainThread;{s} {n}\n" for s, n in stacks) + \
        "thread (8): pin_memory;Thread.run (threading.py:982) 300\n"


def test_fsdps_idle_waits_for_its_collectives_count_as_waiting() -> None:
    """FSDP2 waits for its all-gathers and reduce-scatters on a work handle (C++): the
    innermost Python frame is FSDP's own code in torch/distributed, no collective by name. Idle
    there, the rank waits for its peers; running there, it computes (copies the shards)."""
    from clusterrun.remote.shared import stackrule
    from clusterrun.remote.tools import profiler as remote

    fsdp = "torch/distributed/fsdp/_fully_shard"
    unshard = (f"<module> (train.py:48);Net.forward (train.py:30);"
               f"FSDPParamGroup.wait_for_unshard ({fsdp}/_fsdp_param_group.py:292);"
               f"foreach_all_gather_copy_out ({fsdp}/_fsdp_collectives.py:287)")
    frames = [{"function": f.split(" (")[0], "file": f.split(" (")[1].rsplit(":", 1)[0]}
              for f in unshard.split(";")]
    assert stackrule.peer_wait(frames, active=False) == "foreach_all_gather_copy_out"
    assert stackrule.peer_wait(frames, active=True) is None
    forward = "<module> (train.py:48);Net.forward (train.py:31)"
    # 240 samples in FSDP's wait, 40 of them running (copying out): 200 waited.
    assert remote.count(raw((unshard, 240), (forward, 60)),
                        raw((unshard, 40), (forward, 60))) == (300, 200)


def test_a_wait_share_counts_ddps_idle_backward_and_collectives() -> None:
    from clusterrun.remote.tools import profiler as remote

    backward = ("<module> (train.py:56);Tensor.backward (torch/_tensor.py:623);"
                "_engine_run_backward (torch/autograd/graph.py:979)")
    forward = "<module> (train.py:50);Net.forward (train.py:41)"
    reduce_ = f"<module> (train.py:60);all_reduce ({C10D}:2806)"
    every = raw((backward, 200), (forward, 60), (reduce_, 40))
    # The running samples: 20 of the backward ones computed; the rest sat idle (waiting).
    running = raw((backward, 20), (forward, 60), (reduce_, 40))
    assert remote.count(every, running) == (300, 180 + 40)
    # Without the running record only the collective counts (as before DDP was understood).
    assert remote.count(every) == (300, 40)
    # The straggler: its backward ran all along, nobody waited for it there.
    assert remote.count(raw((backward, 30), (forward, 270)),
                        raw((backward, 30), (forward, 270))) == (300, 0)
    # Idle in its own DataLoader is not a wait for the peers: that rank is the slow one.
    loader = "<module> (train.py:33);_next_data (torch/utils/data/dataloader.py:1450)"
    assert remote.count(raw((loader, 300)), raw()) == (300, 0)
