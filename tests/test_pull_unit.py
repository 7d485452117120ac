"""`clusterrun pull` on this machine, through the local transport (the same outputs.py and
stream path a container or a host without rsync gets): a recorded run whose nodes' working
directories are folders here. The rsync path and real hosts are tests/test_pull.py's."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from clusterrun.errors import SyncError
from clusterrun.pull import channel, targets
from tests.conftest import run_main

RUN = "20260101-000000-train-0001"
NODES = ("node0", "node1")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        return int(sock.getsockname()[1])


def make_run(tmp_path: Path, *, down: bool = False) -> dict[str, Path]:
    """A finished run of NODES (one rank each) on this machine, each node's working directory
    holding its code (older than the run), what its rank wrote (newer) and a cache; with
    ``down`` a third node on a port nobody listens on. Returns each node's working directory."""
    home, workdir = tmp_path / "home", tmp_path / "wd"
    began = time.time()
    nodes, cwds = [], {}
    for name in NODES:  # the code, copied before the run began (its time kept, as rsync -a does)
        cwds[name] = tmp_path / f"cwd-{name}"
        (cwds[name] / "out" / "__pycache__").mkdir(parents=True)
        (cwds[name] / "train.py").write_text("print('train')\n")
        os.utime(cwds[name] / "train.py", (began - 1000, began - 1000))
    time.sleep(0.05)  # the nodes start: each writes its spec
    for name in NODES:
        rundir = workdir / "runs" / RUN / name
        rundir.mkdir(parents=True)
        (rundir / "spec.json").write_text("{}")
    time.sleep(0.05)
    for i, name in enumerate(NODES):  # what the ranks wrote, one with an old time kept (cp -p)
        cwd = cwds[name]
        rundir = workdir / "runs" / RUN / name
        (cwd / "out" / f"rank-{i}.bin").write_bytes(os.urandom(5000 + i))
        (cwd / "metrics.json").write_text(json.dumps({"rank": i}))
        os.utime(cwd / "metrics.json", (began - 5000, began - 5000))
        (cwd / "out" / "__pycache__" / "m.pyc").write_bytes(b"cache")
        (cwd / "link.bin").symlink_to(cwd / "metrics.json")
        nodes.append({"name": name, "host": "localhost", "node_rank": i, "nproc": 1,
                      "ranks": [i, i], "rundir": str(rundir), "cwd": str(cwd),
                      "connection": {"python": sys.executable, "workdir": str(workdir)}})
    if down:
        nodes.append({"name": "node2", "host": "127.0.0.2", "node_rank": 2, "nproc": 1,
                      "ranks": [2, 2], "rundir": "/tmp/nowhere/runs/x/node2", "cwd": "/tmp/x",
                      "connection": {"port": closed_port(), "user": "nobody",
                                     "known_hosts": str(tmp_path / "known_hosts")}})
    run = home / "runs" / RUN
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"run_id": RUN, "name": "train",
                                               "created": began, "nnodes": len(nodes),
                                               "world_size": len(nodes), "nodes": nodes}))
    (run / "state.json").write_text(json.dumps({"id": RUN, "name": "train", "state": "succeeded",
                                                "started_at": began, "ended_at": began + 50}))
    return cwds


@pytest.fixture
def cwds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    return make_run(tmp_path)


def pulled(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run_main(capsys, "pull", RUN, "--json", *args)
    return code, json.loads(out), err


def moved(report: dict[str, Any]) -> dict[str, list[str]]:
    return {n["node"]: sorted(f["path"] for f in n["files"] if f["moved"])
            for n in report["nodes"]}


def test_what_the_ranks_wrote_comes_back_verified(cwds: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = pulled(capsys)
    assert code == 0, report
    files = tmp_path / "home" / "runs" / RUN / "files"
    for i, name in enumerate(NODES):
        here = sorted(str(p.relative_to(files / name)) for p in (files / name).rglob("*")
                      if p.is_file())
        # Not the code (older than the run), nor the cache, nor the symbolic link.
        assert here == ["metrics.json", f"out/rank-{i}.bin"]
        for rel in here:
            assert sha(files / name / rel) == sha(cwds[name] / rel)
    assert moved(report) == {"node0": ["metrics.json", "out/rank-0.bin"],
                             "node1": ["metrics.json", "out/rank-1.bin"]}
    assert {n["method"] for n in report["nodes"]} == {"local"}


def test_a_second_pull_moves_only_what_changed(cwds: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert pulled(capsys)[0] == 0
    code, report, _ = pulled(capsys)
    assert code == 0
    assert moved(report) == {"node0": [], "node1": []}
    (cwds["node1"] / "out" / "extra.txt").write_text("one more\n")
    code, report, _ = pulled(capsys)
    assert moved(report) == {"node0": [], "node1": ["out/extra.txt"]}
    assert [n["moved"] for n in report["nodes"]] == [0, 1]
    copy = tmp_path / "home" / "runs" / RUN / "files" / "node1" / "out" / "extra.txt"
    assert copy.read_text() == "one more\n"
    copy.write_text("damaged")  # a copy here that is not the host's bytes moves again
    code, report, _ = pulled(capsys)
    assert moved(report) == {"node0": [], "node1": ["out/extra.txt"]}
    assert copy.read_text() == "one more\n"


def test_paths_pick_files_whenever_written(cwds: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "dest"
    code, report, _ = pulled(capsys, "train.py", "out/*.bin", "--to", str(dest), "--rank", "1")
    assert code == 0
    assert [n["node"] for n in report["nodes"]] == ["node1"]
    assert moved(report) == {"node1": ["out/rank-1.bin", "train.py"]}
    assert (dest / "node1" / "train.py").read_text() == "print('train')\n"
    code, report, _ = pulled(capsys, "out", "--node", "node0", "--to", str(dest))
    assert moved(report) == {"node0": ["out/__pycache__/m.pyc", "out/rank-0.bin"]}


def test_a_path_that_matches_nothing_anywhere_is_a_usage_error(
        cwds: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "pull", RUN, "nope/*.pt")
    assert code == 2
    assert "nothing matched nope/*.pt on any node" in err
    assert f"node0: {cwds['node0']}" in err


@pytest.mark.parametrize(("args", "words"), [
    (["/etc/passwd"], "relative to the ranks' working directory"),
    (["../x"], "relative to the ranks' working directory"),
    (["--node", "node7"], "has no node node7; its nodes: node0, node1"),
    (["--rank", "0-5"], "has no rank 2, 3, 4, 5; it has ranks 0-1"),
])
def test_usage_errors_name_what_exists(cwds: dict[str, Path], args: list[str], words: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "pull", RUN, *args)
    assert code == 2
    assert words in err
    assert not (cwds["node0"].parent / "home" / "runs" / RUN / "files").exists()


def test_dry_run_lists_and_moves_nothing(cwds: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "pull", RUN, "--dry-run")
    assert code == 0
    assert "node1: 2 files to move" in out
    assert "  out/rank-1.bin  4.9 KiB" in out
    assert not (tmp_path / "home" / "runs" / RUN / "files").exists()
    code, report, _ = pulled(capsys, "--dry-run")
    assert report["dry_run"] and {n["status"] for n in report["nodes"]} == {"listed"}


def test_a_host_down_is_named_and_the_others_are_pulled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    make_run(tmp_path, down=True)
    code, report, err = pulled(capsys, "--connect-timeout", "2")
    assert code == 4
    status = {n["node"]: n["status"] for n in report["nodes"]}
    assert status == {"node0": "pulled", "node1": "pulled", "node2": "unreachable"}
    assert "node2" in err and "The other nodes (node0, node1) were pulled" in err
    assert (tmp_path / "home" / "runs" / RUN / "files" / "node1" / "metrics.json").is_file()


def test_a_destination_inside_the_working_directory_is_never_pulled_again(
        cwds: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    dest = cwds["node0"] / "pulled"
    assert pulled(capsys, "--node", "node0", "--to", str(dest))[0] == 0
    code, report, _ = pulled(capsys, "--node", "node0", "--to", str(dest))
    assert code == 0
    assert sorted(f["path"] for f in report["nodes"][0]["files"]) == [
        "metrics.json", "out/rank-0.bin"]


def test_a_file_written_while_copied_is_copied_again(
        cwds: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = channel.stream
    calls = []

    def racing(*args: Any) -> set[str]:
        calls.append(args[3])
        if len(calls) > 1:
            return real(*args)
        # The rank rewrites it as it is copied, and once more after.
        (cwds["node0"] / "metrics.json").write_text("being written")
        done = real(*args)
        (cwds["node0"] / "metrics.json").write_text("rewritten")
        return done

    monkeypatch.setattr(channel, "stream", racing)
    code, _, _ = pulled(capsys, "--node", "node0")
    assert code == 0
    copy = tmp_path / "home" / "runs" / RUN / "files" / "node0" / "metrics.json"
    assert copy.read_text() == "rewritten"
    assert calls[1] == ["metrics.json"]


def test_a_file_that_never_settles_is_an_error_naming_it(
        cwds: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = channel.stream

    def always(*args: Any) -> set[str]:
        (cwds["node0"] / "metrics.json").write_text(f"{time.monotonic()} as copied")
        done = real(*args)
        (cwds["node0"] / "metrics.json").write_text(f"{time.monotonic()} after")
        return done

    monkeypatch.setattr(channel, "stream", always)
    code, report, err = pulled(capsys, "--node", "node0")
    assert code == 6
    assert report["nodes"][0]["status"] == "failed"
    assert "node0: after copying, metrics.json differ from the host's" in err


def test_a_path_from_the_host_cannot_leave_the_destination(tmp_path: Path) -> None:
    for bad in ("../x", "/etc/x", "a/../../x", "a//b"):
        with pytest.raises(SyncError):
            channel.local_path(tmp_path, bad)
    assert channel.local_path(tmp_path, "a/b.pt") == tmp_path / "a" / "b.pt"


def test_the_run_folder_of_an_attempt() -> None:
    assert targets.run_folder("/w/runs/r1/node0") == "/w/runs/r1"
    assert targets.run_folder("/w/runs/r1/attempt-2/node0") == "/w/runs/r1"


def test_rsync_goes_with_the_connections_ssh_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The argv pull gives rsync (the cluster tests run it): the connection's ssh (strict host
    keys, the bastion), the files on stdin, and what rsync says it moved."""
    import subprocess

    from clusterrun.inventory import HostSpec
    from clusterrun.transport import SshOptions, SshTransport

    spec = HostSpec(host="10.0.0.5", name="gpu-a", master=True, line=0, user="me", port=2222,
                    proxy_jump="jumper@bastion:22", known_hosts=str(tmp_path / "kh"))
    seen: list[tuple[list[str], bytes]] = []
    status = [0]

    def fake(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append((argv, kwargs["input"]))
        return subprocess.CompletedProcess(argv, status[0], b"ckpt/\nckpt/a.pt\nm.json\n",
                                           b"rsync: link down")

    monkeypatch.setattr(channel.subprocess, "run", fake)
    transport = SshTransport(spec, SshOptions())
    moved = channel.rsync(transport, spec, "/w/code/job", ["ckpt/a.pt", "m.json"], tmp_path)
    assert moved == {"ckpt/a.pt", "m.json"}
    argv, given = seen[0]
    assert given == b"ckpt/a.pt\0m.json"
    assert argv[-2:] == ["10.0.0.5:/w/code/job/", f"{tmp_path}/"]
    ssh = argv[argv.index("-e") + 1]
    assert "StrictHostKeyChecking=yes" in ssh and "ProxyCommand=" in ssh and "bastion" in ssh
    status[0] = 24  # a file vanished there since it was listed: the caller lists it again
    assert channel.rsync(transport, spec, "/w", ["x"], tmp_path)
    status[0] = 12
    with pytest.raises(SyncError, match=r"gpu-a: rsync from /w failed \(exit 12\): rsync: link"):
        channel.rsync(transport, spec, "/w", ["x"], tmp_path)
