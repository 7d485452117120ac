"""`proxy_jump:` without a network: what the inventory accepts, what rsync's ssh is told, and
whose key a changed-key error names.
Through a real bastion: tests/test_bastion.py."""

from __future__ import annotations

from pathlib import Path

import fabric
import paramiko
import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError
from clusterrun.inventory import HostSpec
from clusterrun.transport import SshOptions, SshTransport, ssh

from .conftest import write_inventory


@pytest.mark.parametrize(("value", "jump"), [
    ("bastion", (None, "bastion", None)),
    ("ops@bastion.example.com:2222", ("ops", "bastion.example.com", 2222)),
    ("10.0.0.1:22", (None, "10.0.0.1", 22)),
    ("ops@[fe80::1]:2200", ("ops", "fe80::1", 2200)),
    ("fe80::1", (None, "fe80::1", None)),
])
def test_proxy_jump_forms(tmp_path: Path, value: str, jump: tuple[object, ...]) -> None:
    path = write_inventory(tmp_path / "inv.yaml", [{"host": "10.0.0.11"},
                                                   {"host": "10.0.0.12", "proxy_jump": "other"}],
                           defaults={"proxy_jump": value})
    first, second = inventory.load(path).hosts
    assert first.jump == jump
    assert second.jump == (None, "other", None)  # a host's own wins over defaults


@pytest.mark.parametrize("value", ["-oProxyCommand=id", "a@b@c", "bastion:0", "bastion:99999",
                                   "host;id", "bastion:ssh", "[fe80::1]x"])
def test_bad_proxy_jumps_are_refused_with_their_line(tmp_path: Path, value: str) -> None:
    path = write_inventory(tmp_path / "inv.yaml", [{"host": "10.0.0.11", "proxy_jump": value}])
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    assert f"proxy_jump {value!r} is not allowed" in err.value.message
    assert "inv.yaml:" in err.value.message


def test_rsync_goes_through_the_same_jump_with_the_same_strictness() -> None:
    spec = HostSpec("10.0.0.12", "gpu2", master=False, line=1, user="train", port=2200,
                    identity_file="/keys/id", known_hosts="/keys/known",
                    proxy_jump="ops@bastion:2222")
    argv = SshTransport(spec, SshOptions(connect_timeout=5)).ssh_argv()
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert argv[argv.index("-l") + 1] == "train" and argv[argv.index("-p") + 1] == "2200"
    # The bastion gets its own user and port, and every option the host gets.
    assert proxy.endswith("-l ops -p 2222 -W '[%h]:%p' bastion")
    for option in ("StrictHostKeyChecking=yes", "UserKnownHostsFile=/keys/known",
                   "BatchMode=yes", "-i /keys/id"):
        assert option in proxy


@pytest.mark.parametrize(("changed", "named"), [
    ("bastion.example.com", "gpu2's ProxyJump bastion.example.com (from ~/.ssh/config): the host "
                            "key of [bastion.example.com]:2222 has CHANGED"),
    ("10.0.0.12", "gpu2: the host key of 10.0.0.12 has CHANGED"),
])
def test_a_changed_key_names_the_machine_it_belongs_to(changed: str, named: str) -> None:
    """A ProxyJump hop fabric made from ~/.ssh/config is named when its key changed, with the
    entry to remove: not the host it leads to, whose key is fine."""
    spec = HostSpec("10.0.0.12", "gpu2", master=False, line=1)
    cxn = fabric.Connection("10.0.0.12", gateway=fabric.Connection("bastion.example.com",
                                                                  port=2222))
    got, expected = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    error = ssh._classify(spec, cxn, Path("/keys/known"), SshOptions(),
                          paramiko.BadHostKeyException(changed, got, expected))
    assert error.message.startswith(named), error.message
    other = "10.0.0.12" if changed != "10.0.0.12" else "bastion.example.com"
    assert other not in error.message.split(":", 1)[1], error.message
