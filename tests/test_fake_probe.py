"""The fake host (clusterrun/transport/fake_hosts.py) answers what the real probe answers, so the
fast `check` tests run every check the real hosts get; and a check whose fact is missing says
it is unknown instead of passing.

The real probe runs here on this machine, as tests/test_chain.py runs it: real interpreter,
real /proc and /sys, no sshd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from clusterrun.preflight import checks as preflight
from clusterrun.preflight import decide, limits, names, stacks
from clusterrun.preflight import facts as facts_module
from clusterrun.preflight import gpus as gpus_check
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.report import CheckReport
from clusterrun.remote.probe import nvidia as gpus
from clusterrun.remote.shared import protocol
from clusterrun.transport import SshOptions, shell
from clusterrun.transport.fake import FakeNetwork, Interface
from clusterrun.transport.fake_hosts import FakeHost
from clusterrun.transport.pool import Connections
from tests.conftest import fake_inventory, host_spec

# Dicts keyed by data (package, interface, variable, device, looked-up name), not by a fixed
# set of fields: their entries are compared as one shape, "*".
KEYED_BY_DATA = {"packages", "links", "env", "infiniband", "names.resolved", "nvidia.errors"}


def real_facts(workdir: Path, **request: Any) -> dict[str, Any]:
    """The facts line the real probe sends from this machine."""
    proc = subprocess.run([sys.executable, "-u", "-c", shell.BOOTSTRAP],
                          input=shell.program_input("probe.py", {"workdir": str(workdir),
                                                                 "dns_timeout": 5, **request})
                          + b'{"op": "exit"}\n', stdout=subprocess.PIPE, timeout=60, check=True)
    return dict(json.loads(proc.stdout.splitlines()[0])["facts"])


def shape(value: Any, path: str = "") -> dict[str, str]:
    """Every key path in ``value`` -> the JSON type found there (`limits.shm.size`: "number";
    list items share the path `interfaces[]`; None is "null")."""
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    out = {path: kind.get(type(value), "number")}
    if isinstance(value, dict):
        for key, item in value.items():
            name = "*" if path in KEYED_BY_DATA else key
            out.update(shape(item, f"{path}.{name}" if path else name))
    elif isinstance(value, list):
        for item in value:
            out.update(shape(item, f"{path}[]"))
    return out


def test_the_fake_host_sends_every_key_the_real_probe_sends(tmp_path: Path) -> None:
    real = real_facts(tmp_path / "workdir")
    fake = FakeHost("10.0.0.1", [Interface("lo", "127.0.0.1/8"), Interface("eth0", "10.0.0.1/24")],
                    hostname="node1").all_facts({"workdir": str(tmp_path / "workdir")},
                                                "10.0.0.1")
    # Sent whatever the host is like: the same keys both ways, at the top and in the workdir.
    for where, sent, faked in (("", real, fake), ("workdir.", real["workdir"], fake["workdir"])):
        only_real, only_fake = sorted(set(sent) - set(faked)), sorted(set(faked) - set(sent))
        assert not only_real, f"the real probe sends {where}{only_real}, the fake host does not"
        assert not only_fake, f"the fake host sends {where}{only_fake}, the real probe does not"
    # Below that, each key the probe sent from here must be in the fake, with the same type
    # where both have a value (this machine may lack some, e.g. no /dev/shm, no torch).
    real_shape, fake_shape = shape(real), shape(fake)
    missing = sorted(set(real_shape) - set(fake_shape))
    assert not missing, f"the real probe sends {missing}, the fake host does not"
    differ = {p: (t, fake_shape[p]) for p, t in real_shape.items()
              if "null" not in (t, fake_shape[p]) and t != fake_shape[p]}
    assert not differ, f"(probe's type, fake's type) differ: {differ}"


def test_asked_for_an_environment_the_probe_reports_what_pyenv_status_does(
        tmp_path: Path) -> None:
    """With `environment:` the probe names the lock's hash, and reports the environment there
    as pyenv.py's status does (envs/warm.py judges a warm host by it); the fake host sends the
    same keys, and neither sends one without a lock."""
    workdir, lock = tmp_path / "workdir", "0123456789abcdef"
    env = workdir / "envs" / lock
    (env / "lib" / "python3.11" / "site-packages" / "NumPy-2.3.4.dist-info").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.11.2\n")
    real = real_facts(workdir, lock=lock)["pyenv"]
    assert real["env"] == {"path": str(env), "python": "3.11.2", "dists": ["numpy==2.3.4"]}
    proc = subprocess.run([sys.executable, "-u", "-c", shell.BOOTSTRAP],
                          input=shell.program_input("pyenv.py", {"op": "status", "lock": lock,
                                                                 "workdir": str(workdir)}),
                          stdout=subprocess.PIPE, timeout=60, check=True)
    status = json.loads(proc.stdout.splitlines()[-1].removeprefix(protocol.EVENT))
    assert real == {key: status[key] for key in real}
    fake = FakeHost("10.0.0.1", [Interface("eth0", "10.0.0.1/24")]).all_facts(
        {"workdir": str(workdir), "lock": lock}, "10.0.0.1")["pyenv"]
    assert sorted(fake) == sorted(real)
    assert shape(fake)["env"] == "null" and real_facts(workdir)["pyenv"] is None


def test_the_real_probes_facts_leave_no_check_unknown(tmp_path: Path) -> None:
    """What a check reads is where the probe puts it: on this machine's own facts no check
    says "unknown" (the fake's side is test_the_filled_fake_leaves_nothing_unknown)."""
    facts = real_facts(tmp_path / "workdir")
    spec, known = host_spec("10.0.0.1", "here"), HostFacts.from_json(facts)
    found = [*decide.host_checks(spec, known), *gpus_check.host_checks(spec, known),
             *limits.host_checks(spec, known, gpu_ranks=0, world=2),
             *stacks.host_checks(spec, known), names.local_check(spec, known)]
    assert not [c for c in found if c is not None and "unknown" in c.detail], found


def test_the_fake_hosts_gpus_have_the_fields_nvidia_smi_gives() -> None:
    """This machine has no GPU, so the probe's GPU entries are checked against its parser."""
    line = "0, GPU-1f2e, NVIDIA H100 80GB HBM3, 550.54.15, 3, 81559, Default\n"
    [parsed] = gpus.parse_gpus(line)
    nvidia = FakeHost("10.0.0.1", [Interface("eth0", "10.0.0.1/24")], gpus=2).nvidia()
    assert [sorted(g) for g in nvidia["gpus"]] == [sorted(parsed)] * 2
    assert sorted(nvidia) == sorted(FakeHost("10.0.0.1", []).nvidia())
    assert nvidia["count"] == 2 and nvidia["smi"]


def three_hosts() -> FakeNetwork:
    net = FakeNetwork()
    for n in (1, 2, 3):
        net.add(f"10.0.0.{n}", Interface("lo", "127.0.0.1/8"), Interface("eth0", f"10.0.0.{n}/24"),
                hostname=f"node{n}")
    return net


def check(net: FakeNetwork, tmp_path: Path) -> CheckReport:
    inv = fake_inventory(tmp_path, *[host_spec(f"10.0.0.{n}", f"node{n}") for n in (1, 2, 3)])
    with Connections(SshOptions(connect_timeout=1.0), connector=net.connect) as pool:
        return preflight.run(inv, pool)


def unknown(report: CheckReport) -> dict[str, list[tuple[str, bool, str]]]:
    return {h.spec.name: [(c.name, c.warning, c.detail) for c in h.checks
                          if "unknown" in c.detail] for h in report.hosts}


def without(host: FakeHost, path: str) -> None:
    """The host's probe answer, less the fact at ``path`` (`workdir.free`: one level down)."""
    original: Callable[[dict[str, Any], str], dict[str, Any]] = host.all_facts

    def answer(request: dict[str, Any], server: str) -> dict[str, Any]:
        facts = original(request, server)
        *parents, key = path.split(".")
        where = facts
        for parent in parents:
            inner = dict(where[parent])
            where[parent] = inner
            where = inner
        del where[key]
        return facts

    host.all_facts = answer  # type: ignore[method-assign]


def test_the_filled_fake_leaves_nothing_unknown(tmp_path: Path) -> None:
    report = check(three_hosts(), tmp_path)
    assert report.ok and unknown(report) == {"node1": [], "node2": [], "node3": []}


# fact left out -> the check that says it is unknown
MISSING = {"nvidia": "gpus", "names": "names", "limits": "limits", "limits.shm": "limits",
           "limits.nofile": "limits", "workdir.free": "workdir", "packages": "packages",
           "nccl": "nccl", "torch.cuda": "cuda", "links": "mtu", "infiniband": "infiniband",
           "machine": "same_machine", "ptrace": "stacks", "port_range": "port_range",
           "dns": "dns", "dns.seconds": "dns", "python": "python", "python_path": "python",
           "workdir": "workdir", "interfaces": "interface", "hostname": "facts",
           "user": "facts", "gpus": "facts", "env": "facts", "rsync": "facts"}
# Facts whose absence means something of its own, and what it means.
NOT_A_CHECK = {"torch": "not installed: the torch check fails",
               "ssh_server_address": "reached without SSH (a Slurm job step)",
               "pyenv": "sent only when the inventory asks for an `environment:`",
               "cpus": "an older probe: `nproc_per_node: cpu` is refused (plan/build.py)"}


def test_every_fact_the_probe_sends_is_said_unknown_when_it_is_missing() -> None:
    """A fact added to the probe needs its line above: the check that says it is unknown."""
    sent = set(FakeHost("10.0.0.1", [Interface("eth0", "10.0.0.1/24")]).all_facts(
        {"workdir": "/w"}, "10.0.0.1"))
    assert sent == set(facts_module.SENT) | {"pyenv"}
    top = {path.split(".")[0] for path in MISSING}
    assert sorted(sent - top - set(NOT_A_CHECK)) == []
    assert not set(MISSING) & set(NOT_A_CHECK)


def test_a_missing_torch_fails_its_check(tmp_path: Path) -> None:
    net = three_hosts()
    without(net.hosts["10.0.0.2"], "torch")
    report = check(net, tmp_path)
    [torch] = [c for h in report.hosts if h.spec.name == "node2" for c in h.checks
               if c.name == "torch"]
    assert not torch.ok and "torch is not installed" in torch.detail and not report.ok


@pytest.mark.parametrize("fact", sorted(MISSING))
def test_a_check_without_its_fact_says_unknown_and_passes_nothing(tmp_path: Path,
                                                                   fact: str) -> None:
    net = three_hosts()
    without(net.hosts["10.0.0.2"], fact)
    report = check(net, tmp_path)
    found = unknown(report)
    assert found["node1"] == [] and found["node3"] == [], found
    [(name, warning, detail)] = found["node2"]
    assert (name, warning) == (MISSING[fact], True), detail
    assert "not checked" in detail or "not compared" in detail, detail
    assert "unlimited" not in detail
    assert report.ok  # unknown is a warning: the run may go on, told what was not checked


@pytest.mark.parametrize("fact", ["packages", "nccl"])
def test_the_masters_unknown_software_is_said_on_the_master(tmp_path: Path, fact: str) -> None:
    net = three_hosts()
    without(net.hosts["10.0.0.1"], fact)
    found = unknown(check(net, tmp_path))
    assert [n for n, items in found.items() if items] == ["node1"], found
    assert "not compared with the other hosts'" in found["node1"][0][2]


def test_unlimited_open_files_are_said_only_when_the_probe_says_so(tmp_path: Path) -> None:
    net = three_hosts()
    limits = net.hosts["10.0.0.2"].all_facts({}, "")["limits"]
    net.hosts["10.0.0.2"].facts["limits"] = {**limits, "nofile": [None, None]}
    report = check(net, tmp_path)
    details = {h.spec.name: {c.name: c.detail for c in h.checks} for h in report.hosts}
    assert details["node2"]["limits"] == "/dev/shm 32.0 GiB, open files unlimited"
    assert details["node1"]["limits"] == "/dev/shm 32.0 GiB, open files 65536"
