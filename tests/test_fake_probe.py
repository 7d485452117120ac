"""The fake host (clusterrun/transport/fake_hosts.py) answers what the real probe answers, so the
fast `check` tests run every check the real hosts get.

The real probe runs here on this machine, as tests/test_chain.py runs it: real interpreter,
real /proc and /sys, no sshd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from clusterrun.remote import gpus
from clusterrun.transport import shell
from clusterrun.transport.fake import Interface
from clusterrun.transport.fake_hosts import FakeHost

# Dicts keyed by data (package, interface, variable, device, looked-up name), not by a fixed
# set of fields: their entries are compared as one shape, "*".
KEYED_BY_DATA = {"packages", "links", "env", "infiniband", "names.resolved", "nvidia.errors"}


def real_facts(workdir: Path) -> dict[str, Any]:
    """The facts line the real probe sends from this machine."""
    proc = subprocess.run([sys.executable, "-u", "-c", shell.BOOTSTRAP],
                          input=shell.program_input("probe.py", {"workdir": str(workdir),
                                                                 "dns_timeout": 5})
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


def test_the_fake_hosts_gpus_have_the_fields_nvidia_smi_gives() -> None:
    """This machine has no GPU, so the probe's GPU entries are checked against its parser."""
    line = "0, GPU-1f2e, NVIDIA H100 80GB HBM3, 550.54.15, 3, 81559, Default\n"
    [parsed] = gpus.parse_gpus(line)
    nvidia = FakeHost("10.0.0.1", [Interface("eth0", "10.0.0.1/24")], gpus=2).nvidia()
    assert [sorted(g) for g in nvidia["gpus"]] == [sorted(parsed)] * 2
    assert sorted(nvidia) == sorted(FakeHost("10.0.0.1", []).nvidia())
    assert nvidia["count"] == 2 and nvidia["smi"]
