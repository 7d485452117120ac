"""What gets copied to the hosts."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, cast

import pytest

from clusterrun.errors import ClusterrunError, ExitStatus
from clusterrun.inventory import HostSpec
from clusterrun.launch import sync
from clusterrun.launch.headstart import HeadStart
from clusterrun.plan import build as planning
from clusterrun.plan.model import Job, LaunchPlan
from clusterrun.preflight.report import HostReport
from clusterrun.transport.local import LocalTransport
from clusterrun.transport.pool import Connections


def test_gitignore_next_to_the_script_keeps_checkpoints_out_of_the_copy(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("# outputs\ncheckpoints/\n!keep.pt\n*.log\n")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "model.pt").write_bytes(b"x")
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "run.log").write_text("noise\n")
    patterns = sync.DEFAULT_EXCLUDES + sync.gitignored(tmp_path)
    assert sorted(sync.manifest(tmp_path, patterns)) == [".gitignore", "train.py"]


def test_env_files_hold_secrets_and_are_never_copied(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".env").write_text("DB_PASS=x\n")
    (tmp_path / ".env.prod").write_text("DB_PASS=y\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "job.env").write_text("HF_TOKEN=z\n")  # named by --env-file
    (tmp_path / "conf" / "other.env").write_text("A=1\n")
    anchored = sync.env_file_excludes(tmp_path, [str(tmp_path / "conf" / "job.env"), None,
                                                 "/elsewhere/x.env"])
    assert anchored == ("/conf/job.env",)
    copied = sorted(sync.manifest(tmp_path, sync.DEFAULT_EXCLUDES + anchored))
    assert copied == ["conf/other.env", "train.py"]


def _requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every request files.py gets from here on, in order."""
    requests: list[dict[str, Any]] = []
    real_call = sync.call

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        requests.append(args[3])
        return real_call(*args, **kwargs)

    monkeypatch.setattr(sync, "call", counted)
    return requests


def _copy_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             src: Path) -> tuple[Callable[[], str], list[dict[str, Any]], Path]:
    """sync() of ``src`` to one host played by this machine (its own files.py, as shipped), and
    every request files.py got."""
    dest = tmp_path / "host" / "code"
    spec = HostSpec(host="10.0.0.2", name="gpu2", master=True, line=1, python=sys.executable)
    node = SimpleNamespace(name="gpu2", local=False, code_dest="", cwd=str(dest))
    plan = cast(LaunchPlan, SimpleNamespace(code_dir=src, nodes=(node,)))
    requests = _requests(monkeypatch)

    def run() -> str:
        return sync.sync(plan, {"gpu2": LocalTransport(spec)}, {"gpu2": spec},
                         {"gpu2": {"rsync": True}}, ())["gpu2"]

    return run, requests, dest


def test_a_small_change_is_written_and_verified_by_one_program_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "job"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "pkg" / "model.py").write_bytes(bytes(range(256)) * 100)
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o750)
    run, requests, dest = _copy_to(tmp_path, monkeypatch, src)

    assert run() == "ssh: 3 of 3 files copied, all 3 verified"
    assert [len(r.get("write", ())) for r in requests] == [0, 3]  # read, then write + verify
    assert (dest / "pkg" / "model.py").read_bytes() == bytes(range(256)) * 100
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o750
    assert not list(dest.rglob("*.clusterrun-tmp"))

    requests.clear()
    (src / "train.py").write_text("print(2)\n")
    assert run() == "ssh: 1 of 3 files copied, all 3 verified"
    assert [[w[0] for w in r.get("write", ())] for r in requests] == [[], ["train.py"]]
    assert (dest / "train.py").read_text() == "print(2)\n"


def _job(tmp_path: Path) -> Path:
    src = tmp_path / "job"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    return src


def test_nothing_changed_takes_one_round_trip(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    src = _job(tmp_path)
    run, requests, _dest = _copy_to(tmp_path, monkeypatch, src)
    run()
    requests.clear()
    assert run() == "unchanged: 0 of 1 files copied, all 1 verified"
    assert len(requests) == 1 and "write" not in requests[0]


def _sync_error_after_hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              change: Callable[[Path], object]) -> str:
    """The sync's message when ``change(train.py)`` happens here right after it was hashed."""
    src = _job(tmp_path)
    run, _requests, _dest = _copy_to(tmp_path, monkeypatch, src)
    real_manifest = sync.manifest

    def then_change(root: Path, excludes: Sequence[str]) -> dict[str, tuple[int, str]]:
        found = real_manifest(root, excludes)
        change(src / "train.py")
        return found

    monkeypatch.setattr(sync, "manifest", then_change)
    with pytest.raises(ClusterrunError) as caught:
        run()
    assert caught.value.exit_status == ExitStatus.SYNC
    return caught.value.message


def test_a_file_the_host_changes_while_it_is_written_fails_the_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _sync_error_after_hashing(
        tmp_path, monkeypatch, lambda path: path.write_text("print('changed after hashing')\n"))
    assert "gpu2: after copying, 1 file(s) differ" in message


def test_a_file_removed_here_after_hashing_is_a_sync_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _sync_error_after_hashing(tmp_path, monkeypatch, Path.unlink)
    assert f"gpu2: cannot read {tmp_path / 'job' / 'train.py'} to copy it" in message


def test_a_host_that_cannot_write_the_copy_is_a_sync_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _job(tmp_path)
    run, _requests, dest = _copy_to(tmp_path, monkeypatch, src)
    dest.parent.mkdir()
    dest.write_text("a file where the copy's directory goes\n")
    with pytest.raises(ClusterrunError) as caught:
        run()
    assert caught.value.exit_status == ExitStatus.SYNC
    assert (f"gpu2: cannot copy the code to {dest}: {dest} is a file, not a directory. Move "
            f"{dest} out of the way, or: set `workdir:` in the inventory") in caught.value.message
    assert "Traceback" not in caught.value.message


def test_the_manifest_read_during_preflight_is_the_whole_sync_when_nothing_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """launch/headstart.py: each host's manifest is read as soon as its facts are in, without
    creating anything there; the sync after preflight starts from it."""
    src = _job(tmp_path)
    workdir = tmp_path / "host"
    dest = Path(planning.payload_dir(str(workdir), src))
    spec = HostSpec(host="10.0.0.2", name="gpu2", master=True, line=1, python=sys.executable)
    node = SimpleNamespace(name="gpu2", local=False, code_dest="", cwd=str(dest))
    plan = cast(LaunchPlan, SimpleNamespace(code_dir=src, nodes=(node,)))
    transport = LocalTransport(spec)
    pool = cast(Connections, SimpleNamespace(transports={"gpu2": transport}))
    requests = _requests(monkeypatch)

    def launch_once() -> str:
        head = HeadStart(Job(script=src / "train.py"), pool, ())
        report = HostReport(spec, 0, facts={"workdir": {"path": str(workdir)}})
        head.read(report)
        head.answers(30)
        assert requests[-1] == {"root": str(dest), "files": ["train.py"], "mkdir": False}
        return sync.sync(plan, {"gpu2": transport}, {"gpu2": spec}, {"gpu2": {"rsync": True}},
                         (), early=head.answers)["gpu2"]

    assert launch_once() == "ssh: 1 of 1 files copied, all 1 verified"
    assert [r["mkdir"] for r in requests] == [False, True]  # read during preflight, then write
    assert (dest / "train.py").read_text() == "print(1)\n"
    requests.clear()
    assert launch_once() == "unchanged: 0 of 1 files copied, all 1 verified"
    assert len(requests) == 1  # the read during preflight was the check


def test_the_read_during_preflight_creates_nothing_on_the_host(
        tmp_path: Path) -> None:
    src = _job(tmp_path)
    workdir = tmp_path / "host"
    spec = HostSpec(host="10.0.0.2", name="gpu2", master=True, line=1, python=sys.executable)
    pool = cast(Connections, SimpleNamespace(transports={"gpu2": LocalTransport(spec)}))
    head = HeadStart(Job(script=src / "train.py"), pool, ())
    head.read(HostReport(spec, 0, facts={"workdir": {"path": str(workdir)}}))
    early = head.answers(30)
    assert sorted(early.local) == ["train.py"] and early.hosts["gpu2"][1] == {}
    assert not workdir.exists()  # a dry run or a failed preflight leaves the host as it was
