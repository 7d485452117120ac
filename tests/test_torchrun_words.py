"""torchrun's words on `clusterrun launch` (every launcher option of torchrun is taken with its
meaning, taken with a note, passed through --torchrun-arg, or refused with what clusterrun does
instead, from one table: plan/torchrun.py), and one selector syntax (--node NODESET, --rank
0-3,8) on logs and top. The cluster tests check on the hosts: `--nproc-per-node gpu` on hosts
with a fake nvidia-smi, `cpu`, and what `logs` and `top` pick from a real run."""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun.cli import launch as launch_cli
from clusterrun.errors import PreflightError, UsageError
from clusterrun.inventory import HostSpec
from clusterrun.plan import build, torchrun
from clusterrun.preflight.report import HostReport
from tests.conftest import Cluster, copy_payload, run_cli, run_main

DOC = Path(__file__).resolve().parent.parent / "docs" / "bring-your-script.md"
FAKE = Path(__file__).resolve().parent / "fakes" / "nvidia-smi"


def torchrun_options() -> list[str]:
    """Every option string of the installed torchrun's own argument parser."""
    run = pytest.importorskip("torch.distributed.run")
    return [o for action in run.get_args_parser()._actions for o in action.option_strings
            if o not in ("-h", "--help")]


def test_every_torchrun_option_has_an_answer() -> None:
    missing = [o for o in torchrun_options() if torchrun.word(o) is None]
    assert not missing, f"torchrun options the table does not answer: {missing}"


def test_the_doc_holds_the_table_the_code_holds() -> None:
    assert torchrun.markdown() in DOC.read_text(), (
        "docs/bring-your-script.md's table differs from plan/torchrun.py's: paste "
        "torchrun.markdown() there")


def test_launch_help_shows_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(capsys, "launch", "--help")
    assert status == 0
    flat = " ".join(out.split())
    for word in torchrun.WORDS:
        assert f"{word.spelled} ({torchrun.HOW[word.how]}): {word.says}" in flat, word.names


def how(option: str) -> str:
    found = torchrun.word(option)
    return found.how if found is not None else ""


def refusals() -> list[str]:
    """Every spelling of every torchrun option that launch does not take as it is."""
    return [o for o in torchrun_options() if how(o) in (torchrun.PASSED, torchrun.REFUSED)
            or (how(o) == torchrun.NOTED and "_" in o)]


@pytest.mark.parametrize("option", refusals())
def test_launch_answers_torchruns_options_with_the_tables_sentence(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    found = torchrun.word(option)
    assert found is not None
    status, out, err = run_main(capsys, "launch", option, "inv.yaml", str(script))
    assert status == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err  # one paragraph
    assert err.startswith(f"clusterrun: error: unknown option {option} ")
    if found.how == torchrun.PASSED:
        assert f"--torchrun-arg={torchrun.canonical(option)}" in err
    else:
        assert found.says in err
    assert "did you mean" not in err


@pytest.mark.parametrize("option", [o for o in torchrun_options() if how(o) != torchrun.PASSED])
def test_torchrun_arg_refuses_what_clusterrun_sets(option: str) -> None:
    found = torchrun.word(option)
    assert found is not None
    with pytest.raises(UsageError) as refused:
        torchrun.passthrough([f"{option}=1"])
    assert f"clusterrun sets {torchrun.canonical(option)} itself" in refused.value.message
    assert found.says in refused.value.message


@pytest.mark.parametrize("option", [o for o in torchrun_options() if how(o) == torchrun.PASSED])
def test_torchrun_arg_passes_the_rest(option: str) -> None:
    assert torchrun.passthrough([f"{option}=1"]) == (f"{option}=1",)


def test_torchrun_arg_refusal_through_the_cli(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    status, _, err = run_main(capsys, "launch", "--torchrun-arg=--max-restarts=2", "inv.yaml",
                              str(script))
    assert status == 2 and "torchrun's in-place worker restarts are refused" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("nnodes", "fine"), [("3", True), ("3:3", True), ("2", False),
                                               ("1:3", False), ("x", False)])
def test_nnodes_is_the_inventorys_count(nnodes: str, fine: bool,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    if fine:
        launch_cli._check_nnodes(nnodes, 3, "inv.yaml")
        assert "the 3 hosts of inv.yaml, which clusterrun counts itself" in \
            capsys.readouterr().err
        return
    with pytest.raises(UsageError) as refused:
        launch_cli._check_nnodes(nnodes, 3, "inv.yaml")
    assert "takes the node count from the inventory" in refused.value.message
    assert ("--min-nodes MIN" in refused.value.message) == (nnodes == "1:3")


@pytest.mark.parametrize(("value", "shown"), [("gpu", "gpu"), ("cpu", "cpu"), ("auto", "auto"),
                                               ("4", 4)])
def test_nproc_per_node_takes_torchruns_values(value: str, shown: object) -> None:
    from clusterrun.cli.common import nproc_value

    assert nproc_value(None, None, value) == shown  # type: ignore[arg-type]


def test_launch_takes_torchruns_spellings_of_its_own_options() -> None:
    opts = {o for p in launch_cli.launch.params for o in p.opts}
    for word in torchrun.WORDS:
        if word.how == torchrun.SAME:
            assert set(word.names) <= opts, word.names
    assert {"--nproc_per_node", "--master_port", "--nnodes"} <= opts


def test_nproc_per_node_refuses_xpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run_main(capsys, "launch", "--nproc_per_node", "xpu", "inv.yaml", "x.py")
    assert status == 2 and "'xpu' is neither a positive number nor `auto`" in err, err


def host(name: str, nproc: object, gpus: int, cpus: object) -> HostReport:
    spec = HostSpec(host=name, name=name, master=False, line=1, nproc_per_node=nproc)  # type: ignore[arg-type]
    return HostReport(spec, 0, facts={"gpus": gpus, "cpus": cpus})


@pytest.mark.parametrize(("nproc", "gpus", "cpus", "count"), [
    ("gpu", 4, 16, 4), ("cpu", 4, 16, 16), ("auto", 4, 16, 4), ("auto", 0, 16, 1), (2, 4, 16, 2),
    ("gpu", 0, 16, None), ("cpu", 0, None, None)])
def test_each_host_resolves_its_count(nproc: object, gpus: int, cpus: object,
                                      count: object) -> None:
    assert host("a", nproc, gpus, cpus).nproc == count


def test_gpu_on_a_host_without_gpus_is_refused_naming_it() -> None:
    hosts = [host("gpu1", "gpu", 2, 8), host("cpu1", "gpu", 0, 8), host("cpu2", "gpu", 0, 8)]
    with pytest.raises(PreflightError, match=r"no GPU that nvidia-smi sees on cpu\[1-2\]"):
        build._nprocs(hosts, None)
    assert build._nprocs(hosts[:1], None) == [2]
    assert build._nprocs(hosts, 3) == [3, 3, 3]


# -- on the namespace cluster -------------------------------------------------------------------

GPU_HOSTS = ["node20", "node21"]


def fake_gpus(cluster: Cluster, name: str, count: int) -> str:
    """A fake nvidia-smi reporting ``count`` idle GPUs in a fresh folder of the host's /tmp."""
    folder_name = f"gpufake-{uuid.uuid4().hex[:8]}"
    folder = cluster.sb.root / name / "tmp" / folder_name
    folder.mkdir(mode=0o755)
    shutil.copy(FAKE, folder / "nvidia-smi")
    (folder / "nvidia-smi").chmod(0o755)
    (folder / "nvidia-smi.json").write_text(json.dumps(
        {"driver_version": "550.54.15", "gpus": [{}] * count}))
    (folder / "nvidia-smi.json").chmod(0o644)
    return f"export PATH=/tmp/{folder_name}:$PATH"


def rank_env(cluster: Cluster, names: list[str],
             test_dir: str) -> dict[int, tuple[str, dict[str, str]]]:
    """What each rank wrote about itself on its own host: rank -> (host, environment)."""
    found = {}
    for name in names:
        listing = cluster.run_on(name, "sh", "-c", f"ls {test_dir} 2>/dev/null || true")
        for file in listing.split():
            data = json.loads(cluster.read(name, f"{test_dir}/{file}"))
            found[int(data["env"]["RANK"])] = (name, data["env"])
    return found


@pytest.fixture
def left_clean(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all([*GPU_HOSTS, "node22", "node1", "node2", "node3"])


@pytest.mark.cluster
def test_nproc_per_node_gpu_and_cpu_on_each_host(cluster: Cluster, home: Path, tmp_path: Path,
                                                  payload: Path, left_clean: None) -> None:
    setups = {"node20": fake_gpus(cluster, "node20", 2), "node21": fake_gpus(cluster, "node21", 3)}
    inv = cluster.inventory(tmp_path / "inv.yaml", GPU_HOSTS,
                            hosts={n: {"setup": s} for n, s in setups.items()})
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    cp = run_cli("launch", "--nproc-per-node", "gpu", "--env", f"TEST_DIR={test_dir}", str(inv),
                 str(payload))
    assert cp.returncode == 0, cp.stderr
    ranks = rank_env(cluster, GPU_HOSTS, test_dir)
    assert {r: h for r, (h, _) in ranks.items()} == {0: "node20", 1: "node20", 2: "node21",
                                                      3: "node21", 4: "node21"}
    for _, (name, env) in ranks.items():
        assert env["WORLD_SIZE"] == "5"
        assert env["LOCAL_WORLD_SIZE"] == {"node20": "2", "node21": "3"}[name]

    # A host without GPUs is named, and nothing starts anywhere.
    inv3 = cluster.inventory(tmp_path / "inv3.yaml", [*GPU_HOSTS, "node22"],
                             hosts={n: {"setup": s} for n, s in setups.items()})
    before = cluster.run_on("node20", "sh", "-c", "ls /tmp/clusterrun/runs | wc -l")
    cp = run_cli("launch", "--nproc_per_node", "gpu", str(inv3), str(payload))
    assert cp.returncode == 3, cp.stderr
    assert "nproc_per_node gpu: no GPU that nvidia-smi sees on node22" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert cluster.run_on("node20", "sh", "-c", "ls /tmp/clusterrun/runs | wc -l") == before

    # `cpu`: the CPUs each host lets its processes run on, as torchrun counts them.
    cpus = int(cluster.run_on("node22", "nproc"))
    test_dir = f"/tmp/clusterrun-test/{uuid.uuid4().hex[:8]}"
    inv1 = cluster.inventory(tmp_path / "inv1.yaml", ["node22"])
    cp = run_cli("launch", "--nproc-per-node", "cpu", "--env", f"TEST_DIR={test_dir}", str(inv1),
                 str(payload))
    assert cp.returncode == 0, cp.stderr
    assert sorted(rank_env(cluster, ["node22"], test_dir)) == list(range(cpus))


LOG_HOSTS = ["node1", "node2", "node3"]


@pytest.mark.cluster
def test_logs_picks_by_nodeset_and_rank_list(cluster: Cluster, home: Path, tmp_path: Path,
                                             payload: Path, left_clean: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", LOG_HOSTS)
    cp = run_cli("launch", "--nproc-per-node", "3", str(inv), str(payload))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) succeeded", cp.stderr).group(1)  # type: ignore[union-attr]
    # What the ranks wrote, read on their own hosts: node1 holds ranks 0-2, node2 3-5.
    expected = []
    for name, ranks in (("node1", [0, 1, 2]), ("node2", [3])):
        for rank in ranks:
            text = cluster.read(name, f"/tmp/clusterrun/runs/{run_id}/{name}/rank-{rank}.log")
            expected += [f"[{name} r{rank}] {line}" for line in text.splitlines()]
    assert expected
    cp = run_cli("logs", run_id, "--rank", "0-3", "--node", "node[1-2]")
    assert cp.returncode == 0, cp.stderr
    assert sorted(cp.stdout.splitlines()) == sorted(expected)

    cp = run_cli("logs", run_id, "--rank", "0-2", "--node", "node3")
    assert cp.returncode == 2
    assert "none of ranks 0-2 runs on node3 (node3 holds 6-8)" in cp.stderr
    cp = run_cli("logs", run_id, "--node", "node[3-4]")
    assert cp.returncode == 2 and "has no node node4; its nodes: node[1-3]" in cp.stderr


@pytest.mark.cluster
def test_top_once_shows_the_ranks_picked(cluster: Cluster, home: Path, tmp_path: Path,
                                         left_clean: None) -> None:
    ticker = copy_payload(tmp_path, "ticker.py", "ticker")
    inv = cluster.inventory(tmp_path / "inv.yaml", LOG_HOSTS[:2])
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "3", "--env",
                 "STEP_SLEEP=0.3", str(inv), str(ticker))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    try:
        # Every rank has started and printed: its pid and lines are there to show.
        deadline = time.monotonic() + 120
        for name, ranks in (("node1", [0, 1]), ("node2", [2, 3])):
            for rank in ranks:
                path = f"/tmp/clusterrun/runs/{run_id}/{name}/rank-{rank}.log"
                while cluster.run_on(name, "sh", "-c", f"cat {path} 2>/dev/null || true"
                                     ).count("\n") < 3:
                    assert time.monotonic() < deadline, f"{name} rank {rank} printed nothing"
                    time.sleep(0.5)
        cp = run_cli("top", run_id, "--once", "--json", "--interval", "1", "--rank", "1-2",
                     timeout=120)
        assert cp.returncode == 0, cp.stderr
        sample = json.loads(cp.stdout)
        assert [(r["rank"], r["node"]) for r in sample["ranks"]] == [(1, "node1"), (2, "node2")]
        assert all(r["pid"] for r in sample["ranks"])
        assert [h["node"] for h in sample["hosts"]] == ["node1", "node2"]
        cp = run_cli("top", run_id, "--once", "--json", "--interval", "1", "--node", "node2",
                     timeout=120)
        assert cp.returncode == 0, cp.stderr
        sample = json.loads(cp.stdout)
        assert [r["rank"] for r in sample["ranks"]] == [2, 3]
        assert [h["node"] for h in sample["hosts"]] == ["node2"]
        cp = run_cli("top", run_id, "--once", "--rank", "9")
        assert cp.returncode == 2 and "has no rank 9; it has ranks 0-3" in cp.stderr
        cp = run_cli("stop", run_id, "--node", "node2")
        assert cp.returncode == 2 and "`stop` ends a run on every host" in cp.stderr
    finally:
        assert run_cli("stop", run_id).returncode == 0
