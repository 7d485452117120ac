"""A workdir or code directory a host cannot use: each case names the host, the path in the way
and the fix (`workdir:`), with exit 3 at preflight (`check`, `launch`) and 6 at the copy, never
an OSError's bare words (`lo2: FileNotFoundError: [Errno 2] ... '/home/USER'`).

No root and no sshd: hosts on this machine (the local transport). As root, the cases that need
a user without rights run the real command as `nobody`; read-only and full filesystems are
words from the host's facts here, and a real read-only home is in test_host_paths_cluster.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from clusterrun.errors import ClusterrunError, ExitStatus
from clusterrun.inventory import HostSpec
from clusterrun.launch import sync
from clusterrun.plan.model import LaunchPlan
from clusterrun.preflight import hostpaths
from clusterrun.transport.local import LocalTransport
from tests.conftest import REPO
from tests.other_user import OtherUser, readable_copy

PROBE = REPO / "clusterrun" / "remote" / "probe" / "probe.py"


def as_user(other_user: OtherUser, *args: str, home: str,
            clusterrun_home: str | None = None) -> tuple[str, subprocess.CompletedProcess[str]]:
    """The real CLI as a user without rights here (as root: `nobody`), with $HOME ``home``;
    returns that user's name and the result."""
    env = {} if clusterrun_home is None else {"CLUSTERRUN_HOME": clusterrun_home}
    return other_user.name, other_user.run(*args, home=home, env=env)


def local_inventory(path: Path, **defaults: str) -> Path:
    lines = [f"  {k}: {v}\n" for k, v in defaults.items()]
    path.write_text(("defaults:\n" + "".join(lines) if lines else "")
                    + "hosts:\n  - host: localhost\n    name: lo1\n"
                    "  - host: localhost\n    name: lo2\n")
    path.chmod(0o644)
    return path


def test_a_user_without_a_home_directory_is_told_the_path_and_the_fix(
        shared: Path, other_user: OtherUser) -> None:
    """The issue's case: `check inventories/localhost.yaml` by a user whose home is missing."""
    home = f"/nonexistent-clusterrun-{uuid.uuid4().hex[:8]}"
    localhost = readable_copy(REPO / "inventories" / "localhost.yaml", shared)
    user, cp = as_user(other_user, "check", str(localhost), home=home)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    out = " ".join(cp.stdout.split())
    assert (f"node0: workdir: cannot use workdir {home}/.clusterrun/local-nodes on node0: the "
            f"home directory {home} of {user} does not exist there. Set `workdir:` in the "
            f"inventory to a directory {user} can create and write there") in out, out
    assert "CLUSTERRUN_HOME" in out  # local hosts keep their files under it
    assert "FileNotFoundError" not in cp.stdout + cp.stderr
    assert "Traceback" not in cp.stdout + cp.stderr
    assert not os.path.exists(home)

    # The fix as the message words it: a workdir the user can write.
    writable = shared / "wd"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    inv = local_inventory(shared / "inv.yaml", workdir=str(writable / "w"))
    _user, cp = as_user(other_user, "check", str(inv), home=home)
    assert cp.returncode == ExitStatus.SUCCESS, cp.stdout + cp.stderr


def test_a_workdir_the_user_may_not_write_names_the_directory(
        shared: Path, other_user: OtherUser) -> None:
    closed = shared / "closed"
    closed.mkdir()
    closed.chmod(0o555)
    inv = local_inventory(shared / "inv.yaml", workdir=str(closed / "runs-here"))
    user, cp = as_user(other_user, "check", str(inv), home=str(shared))
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    out = " ".join(cp.stdout.split())
    assert (f"lo2: workdir: cannot use workdir {closed}/runs-here on lo2: {user} may not write "
            f"to {closed} (permission denied). Set `workdir:`") in out, out
    assert "PermissionError" not in out


def probe_check_workdir(path: Path) -> dict[str, Any]:
    """The probe's own workdir check, run here (its functions, not its server)."""
    namespace: dict[str, Any] = {"__name__": "probe_under_test"}
    source = PROBE.read_text().replace("\nserve()\n", "\n")
    exec(compile(source, str(PROBE), "exec"), namespace)
    return cast(dict[str, Any], namespace["check_workdir"](str(path)))


def test_a_file_where_the_workdir_should_be(tmp_path: Path) -> None:
    spot = tmp_path / "clusterrun"
    spot.write_text("not a directory\n")
    found = probe_check_workdir(spot)
    assert not found["ok"] and found["errno"] == "EEXIST"
    assert hostpaths.explain("gpu1", found) == (
        f"cannot use workdir {spot} on gpu1: {spot} is a file, not a directory. Move {spot} "
        f"out of the way, or: set `workdir:` in the inventory to a directory {found['user']} "
        f"can create and write there (for example `workdir: /tmp/clusterrun-{found['user']}`).")

    inside = probe_check_workdir(spot / "deeper" / "wd")  # a file as one of its parents
    assert inside["errno"] == "ENOTDIR" and inside["existing"] == str(spot)
    assert hostpaths.cause(inside) == (f"{spot} is a file, not a directory, and "
                                       f"{spot}/deeper/wd would be inside it")


def facts(errno: str, **over: Any) -> dict[str, Any]:
    base = {"path": "/home/ann/clusterrun", "ok": False, "error": "x", "errno": errno,
            "failed_at": "/home/ann/clusterrun", "existing": "/home/ann",
            "existing_is_dir": True, "writable": True, "user": "ann", "home": "/home/ann",
            "home_exists": True}
    return {**base, **over}


@pytest.mark.parametrize(("found", "cause"), [
    (facts("EROFS"), "/home/ann is on a read-only filesystem"),
    (facts("ENOSPC"), "the disk that holds /home/ann is full"),
    (facts("EDQUOT"), "ann's disk quota on the filesystem of /home/ann is used up"),
    (facts("EACCES", writable=False), "ann may not write to /home/ann (permission denied)"),
    (facts("EACCES", existing="/", path="/home/ann/clusterrun", home_exists=False,
           writable=False), "the home directory /home/ann of ann does not exist there"),
    (facts("EIO", error="Input/output error"),
     "Input/output error (/home/ann/clusterrun)"),
], ids=["read-only", "disk-full", "quota", "no-permission", "no-home", "other"])
def test_each_filesystem_error_is_worded_with_its_path(found: dict[str, Any],
                                                       cause: str) -> None:
    text = hostpaths.explain("gpu-a", found)
    assert text.startswith(f"cannot use workdir /home/ann/clusterrun on gpu-a: {cause}. "), text
    assert "`workdir:`" in text and "/tmp/clusterrun-ann" in text
    if found["errno"] in ("ENOSPC", "EDQUOT"):
        assert "Free space there" in text


def copy_to(tmp_path: Path, dest: Path) -> Any:
    """sync() of a one-file job to one host played by this machine, into ``dest``."""
    src = tmp_path / "job"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "pkg" / "model.py").write_text("W = 1\n")
    spec = HostSpec(host="10.0.0.2", name="gpu2", master=True, line=1, python=sys.executable)
    node = SimpleNamespace(name="gpu2", local=False, code_dest="", cwd=str(dest))
    plan = cast(LaunchPlan, SimpleNamespace(code_dir=src, nodes=(node,)))
    with pytest.raises(ClusterrunError) as caught:
        sync.sync(plan, {"gpu2": LocalTransport(spec)}, {"gpu2": spec},
                  {"gpu2": {"rsync": False}}, ())
    assert caught.value.exit_status == ExitStatus.SYNC
    assert "Traceback" not in caught.value.message
    return " ".join(caught.value.message.split())


def test_the_copy_names_a_file_in_the_way_of_one_of_its_directories(tmp_path: Path) -> None:
    dest = tmp_path / "host" / "code"
    (dest / "x").mkdir(parents=True)
    (dest / "pkg").write_text("a file where the copy needs a directory\n")
    message = copy_to(tmp_path, dest)
    assert (f"gpu2: cannot copy the code to {dest}: {dest}/pkg is a file, not a directory. "
            f"Move {dest}/pkg out of the way") in message, message


def test_the_copy_names_a_directory_in_the_way_of_one_of_its_files(tmp_path: Path) -> None:
    dest = tmp_path / "host" / "code"
    (dest / "train.py").mkdir(parents=True)
    message = copy_to(tmp_path, dest)
    assert (f"gpu2: cannot copy the code to {dest}: {dest}/train.py is a directory where a file "
            "should be") in message, message


def test_launch_without_a_home_directory_says_where_to_keep_the_runs(
        shared: Path, other_user: OtherUser) -> None:
    """Before any host: clusterrun's own state ($CLUSTERRUN_HOME, default ~/.clusterrun) has
    nowhere to go either, and `$HOME/.clusterrun` would be no answer."""
    home = f"/nonexistent-clusterrun-{uuid.uuid4().hex[:8]}"
    script = shared / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('never')\n")
    script.parent.chmod(0o755)
    script.chmod(0o644)
    localhost = readable_copy(REPO / "inventories" / "localhost.yaml", shared)
    user, cp = as_user(other_user, "launch", str(localhost), str(script),
                       home=home)
    assert cp.returncode == ExitStatus.USAGE, cp.stdout + cp.stderr
    message = " ".join(cp.stderr.split())
    assert f"your home directory {home} does not exist" in message, message
    assert f"export CLUSTERRUN_HOME=/tmp/clusterrun-{user}" in message
    assert "Traceback" not in cp.stderr
