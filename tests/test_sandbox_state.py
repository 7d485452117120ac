"""The sandbox's state file (clusterrun/sandbox/state.py): a sandbox.json as `sandbox up` and its
add-ons write it is read into typed records and written back byte for byte, so a sandbox built by
an earlier clusterrun is still read, and removed, by this one.

The files under tests/golden/sandbox/ were written by `clusterrun sandbox up 2` (state-up.json),
then add_network, containers on node1, docker on node2 and Slurm on both (state-addons.json); only
the Python's paths were changed. No kernel object is built here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clusterrun import sandbox
from clusterrun.errors import SandboxError
from clusterrun.sandbox import cluster
from clusterrun.sandbox.state import DaemonRecord, SandboxState

GOLDEN = Path(__file__).resolve().parent / "golden" / "sandbox"
FILES = ["state-up.json", "state-addons.json"]


@pytest.mark.parametrize("name", FILES)
def test_a_written_state_reads_and_writes_back_the_same(name: str) -> None:
    text = (GOLDEN / name).read_text()
    state = SandboxState.from_json(json.loads(text))
    assert json.dumps(state.to_json(), indent=2) + "\n" == text


@pytest.mark.parametrize("name", FILES)
def test_write_state_keeps_the_file_as_read(tmp_path: Path, name: str) -> None:
    shutil.copyfile(GOLDEN / name, tmp_path / cluster.STATE_FILE)
    cluster.write_state(tmp_path, cluster.read_state(tmp_path))
    assert (tmp_path / cluster.STATE_FILE).read_text() == (GOLDEN / name).read_text()


def test_the_records_hold_what_the_file_says(tmp_path: Path) -> None:
    shutil.copyfile(GOLDEN / "state-addons.json", tmp_path / cluster.STATE_FILE)
    state = cluster.read_state(tmp_path)
    assert [(h.name, h.netns, h.sshd_pid) for h in state.hosts] == [
        ("node1", "cr-54a0ae-node1", 6337), ("node2", "cr-54a0ae-node2", 6339)]
    assert state.status == "up" and state.created_root and state.rc_file is None
    assert [nic.ifname for nic in state.networks[0].nics] == ["ib0", "ens6"]
    assert state.containers is not None and state.containers.hosts == ["node1"]
    assert state.docker is not None and list(state.docker.hosts) == ["node2"]
    assert state.docker.hosts["node2"].daemon == DaemonRecord("dockerd of node2", 6446, 2283401)
    assert state.slurm is not None and state.slurm.nodes == ("node1", "node2")
    assert [[r.name for r in group] for group in state.slurm.daemons] == [
        ["slurmd node1", "slurmd node2"], ["slurmctld"], ["munged"]]

    sb = sandbox.load(tmp_path)  # the Sandbox tests use, made from the same records
    assert sb.host("node2").address == "10.222.183.12" and sb.prefix == "54a0ae"
    assert sb.networks[0].nics[1].address == "10.140.0.12"


def test_an_add_on_undone_leaves_no_entry(tmp_path: Path) -> None:
    """What slurm._undo() does: the entry goes, and the file is as before enabling it."""
    shutil.copyfile(GOLDEN / "state-addons.json", tmp_path / cluster.STATE_FILE)
    state = cluster.read_state(tmp_path)
    state.slurm = None
    doc = json.loads((GOLDEN / "state-addons.json").read_text())
    del doc["slurm"]
    assert state.to_json() == doc


@pytest.mark.parametrize(("key", "value", "named"), [
    ("hosts", {"node1": {}}, "hosts"),
    ("prefix", None, "prefix"),
    ("status", "half", "status"),
    ("docker", {"hosts": {"node2": {"cgroup": "x"}}, "mounts": None, "path": "/bin"}, "None"),
])
def test_a_damaged_state_is_a_sandbox_error_naming_the_value(
        tmp_path: Path, key: str, value: object, named: str) -> None:
    doc = json.loads((GOLDEN / "state-addons.json").read_text())
    doc[key] = value
    (tmp_path / cluster.STATE_FILE).write_text(json.dumps(doc))
    with pytest.raises(SandboxError, match=f"cannot read .*{named}"):
        cluster.read_state(tmp_path)


@pytest.mark.parametrize("said", ["RTNETLINK answers: No such device",
                                  'Cannot find device "crx"', "Cannot open network namespace"])
def test_deleting_what_is_already_gone_is_no_error(said: str) -> None:
    """`down` lists the links, then deletes them: a veth whose namespace was just deleted may
    vanish in between (the kernel destroys it a moment later)."""
    from clusterrun.sandbox import net

    errors: list[str] = []
    net.delete_quietly(["sh", "-c", f"echo '{said}' >&2; exit 2"], errors)
    assert errors == []
    net.delete_quietly(["sh", "-c", "echo 'Operation not permitted' >&2; exit 2"], errors)
    assert len(errors) == 1 and "Operation not permitted" in errors[0]
