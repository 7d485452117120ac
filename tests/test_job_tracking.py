"""The supervisor's job cgroup (remote/hostlib/cgroup.py), its free-space watch
(remote/shared/diskfloor.py), and the launch note for hosts without a cgroup (launch/tracking.py):
no root, no cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clusterrun.launch.outcome import NodeOutcome
from clusterrun.launch.tracking import untracked_note
from clusterrun.plan.model import NodePlan
from clusterrun.remote.hostlib import cgroup
from clusterrun.remote.node import diskwatch
from clusterrun.remote.shared import diskfloor
from clusterrun.wire import Started
from tests.conftest import host_spec

HYBRID = """\
25 1 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:8 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory
"""
V1_ONLY = HYBRID.replace("cgroup2 cgroup2", "cgroup cgroup")


def test_the_cgroup2_mount_is_found_in_mountinfo(tmp_path: Path) -> None:
    (tmp_path / "hybrid").write_text(HYBRID)
    (tmp_path / "v1").write_text(V1_ONLY)
    assert cgroup.mount_point(str(tmp_path / "hybrid")) == "/sys/fs/cgroup/unified"
    assert cgroup.mount_point(str(tmp_path / "v1")) is None
    assert cgroup.mount_point(str(tmp_path / "missing")) is None


def test_own_path_is_the_v2_line(tmp_path: Path) -> None:
    (tmp_path / "cg").write_text("12:memory:/x\n0::/user.slice/session-3.scope\n")
    assert cgroup.own_path(str(tmp_path / "cg")) == "/user.slice/session-3.scope"
    (tmp_path / "v1").write_text("12:memory:/x\n")
    assert cgroup.own_path(str(tmp_path / "v1")) is None


def test_names_are_one_path_component() -> None:
    name = cgroup.name_for("20261122-run", "node/../x\n", "a0")
    assert name.startswith("clusterrun-20261122-run.")
    assert "/" not in name and "\n" not in name
    assert len(cgroup.name_for("r" * 300, "n", "a0")) == 200


def test_create_says_why_there_is_none(tmp_path: Path) -> None:
    (tmp_path / "v1").write_text(V1_ONLY)
    assert cgroup.create("x", str(tmp_path / "v1")) == (None, "no cgroup v2 file system is mounted")
    (tmp_path / "hybrid").write_text(HYBRID.replace("/sys/fs/cgroup/unified", str(tmp_path / "cg")))
    (tmp_path / "own").write_text("1:name=systemd:/\n")
    assert cgroup.create("x", str(tmp_path / "hybrid"), str(tmp_path / "own")) == (
        None, "this process is in no cgroup v2")
    # A directory standing in for the hierarchy, whose cgroup.procs this user cannot write.
    (tmp_path / "cg" / "session").mkdir(parents=True)
    procs = tmp_path / "cg" / "session" / "cgroup.procs"
    procs.write_text("")
    procs.chmod(0o444)
    (tmp_path / "own").write_text("0::/session\n")
    path, why = cgroup.create("x", str(tmp_path / "hybrid"), str(tmp_path / "own"))
    if os.geteuid() == 0:  # root writes anyway: the cgroup is made
        assert path == str(tmp_path / "cg" / "session" / "x") and why is None
    else:
        assert path is None and why is not None and "not delegated" in why


def test_the_cgroup_is_off_with_clusterrun_cgroup_0() -> None:
    assert cgroup.for_job({"CLUSTERRUN_CGROUP": "0"}, "node1") == (None, "CLUSTERRUN_CGROUP=0")


def test_the_disk_watch_looks_once_a_second_and_tells_once(tmp_path: Path) -> None:
    roomy = diskwatch.Watch(str(tmp_path), floor=1)
    assert roomy.check(0.0) is None
    full = diskwatch.Watch(str(tmp_path), floor=1 << 62)  # more than any disk has free
    first = full.check(10.0)
    assert first is not None and str(tmp_path) in first and "nearly full" in first
    assert "`workdir:`" in first
    assert full.check(20.0) is None  # said once
    gone = diskwatch.Watch(str(tmp_path / "missing"), floor=1 << 62)
    assert gone.check(0.0) is None  # cannot be told: no false alarm
    later = diskwatch.Watch(str(tmp_path), floor=1 << 62, every=5)
    later.next = 3.0
    assert later.check(1.0) is None  # not yet time to look


def test_sizes_read_as_people_write_them() -> None:
    assert diskfloor.size_text(512) == "512 bytes"
    assert diskfloor.size_text(8 * 1024 * 1024) == "8.0 MiB"
    assert diskfloor.size_text(3 * 1024 ** 3) == "3.0 GiB"


def _node(name: str, started: Started | None) -> NodeOutcome:
    plan = NodePlan(name=name, host=name, local=False, node_rank=0, nproc=1, first_rank=0,
                    interface="eth0", address="", python="python3", setup=None, workdir="/w",
                    rundir="/w/r", cwd="/w/c", argv=(), env=())
    return NodeOutcome(plan, started=started)


def test_the_note_names_ssh_hosts_without_a_cgroup_once_and_folds_them() -> None:
    specs = {n: host_spec(n) for n in ("node1", "node2", "node3", "box")}
    specs["box"] = host_spec("box", container="trainer")
    why = "cannot create a cgroup under /sys/fs/cgroup/user.slice: Permission denied"
    nodes = {
        "node1": _node("node1", Started(0.0, cgroup_why=why)),
        "node2": _node("node2", Started(0.0, cgroup_why=why)),
        "node3": _node("node3", Started(0.0, cgroup="/sys/fs/cgroup/clusterrun-r.node3.a0")),
        "box": _node("box", Started(0.0, cgroup_why="no cgroup v2 file system is mounted")),
    }
    note = untracked_note(nodes, specs)
    assert note is not None
    assert note.startswith(f"note: no cgroup for the job on node[1-2] ({why})")
    assert "box" not in note and "node3" not in note
    nodes["node1"] = _node("node1", Started(0.0, cgroup="/x"))
    nodes["node2"] = _node("node2", Started(0.0, cgroup="/y"))
    assert untracked_note(nodes, specs) is None


def test_the_shipped_modules_run_alone() -> None:
    """cgroup.py and diskfloor.py are shipped to hosts: stdlib only, importable with no
    clusterrun around them."""
    for module in (cgroup, diskfloor):
        source = Path(module.__file__).read_text()
        cp = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True,
                            text=True, check=False)
        assert cp.returncode == 0, cp.stderr
