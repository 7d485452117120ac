"""The launch's steps hand each other values: preflight stopped after the facts is a report
saying so (no exception, no host replaced for it), and a host's environment status is read
into types that `env --json` writes back with its documented keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from clusterrun import inventory
from clusterrun.envs import sync
from clusterrun.envs.hoststatus import HostStatus
from clusterrun.envs.verify import Built
from clusterrun.inventory.slots import Slots
from clusterrun.preflight import checks as preflight
from clusterrun.preflight import spares
from clusterrun.preflight.report import HostReport
from clusterrun.transport import SshOptions
from clusterrun.transport.fake import FakeNetwork, Interface
from clusterrun.transport.pool import Connections
from tests.conftest import fake_inventory, host_spec


def _net() -> FakeNetwork:
    net = FakeNetwork()
    for n in (1, 2, 3):
        net.add(f"10.0.0.{n}", Interface("lo", "127.0.0.1/8"), Interface("eth0", f"10.0.0.{n}/24"),
                hostname=f"gpu-{n}")
    return net


def test_preflight_told_to_stop_after_the_facts_returns_them_stopped(tmp_path: Path) -> None:
    inv = fake_inventory(tmp_path, host_spec("10.0.0.1", "a"), host_spec("10.0.0.2", "b"))
    seen: list[list[str]] = []

    def stop(reports: Sequence[HostReport]) -> bool:
        seen.append([r.spec.name for r in reports])
        return False

    with Connections(SshOptions(connect_timeout=1.0), connector=_net().connect) as pool:
        report = preflight.run(inv, pool, after_facts=stop)
    assert seen == [["a", "b"]] and report.stopped
    assert report.master_addr is None and report.pairs is None
    names = {c.name for h in report.hosts for c in h.checks}
    assert "ssh" in names and "data_path" not in names  # the facts' checks, nothing after
    with Connections(SshOptions(connect_timeout=1.0), connector=_net().connect) as pool:
        report = preflight.run(inv, pool, after_facts=lambda _reports: True)
    assert not report.stopped and report.ok and report.master_addr == "10.0.0.1"


def test_a_stopped_check_replaces_no_host_with_a_spare(tmp_path: Path) -> None:
    """What the facts showed of a host before preflight stopped is not its verdict."""
    net = _net()
    net.hosts["10.0.0.2"].probe = "exits"  # it fails: a spare would take its slot
    inv = fake_inventory(tmp_path, host_spec("10.0.0.1", "a"), host_spec("10.0.0.2", "b"),
                         dataclasses.replace(host_spec("10.0.0.3", "c"), spare=True))
    slots = Slots.initial(inv)
    with Connections(SshOptions(connect_timeout=1.0), connector=net.connect) as pool:
        report = spares.check(inv, pool, slots, attempt=1, data_path=True,
                              allow_busy_gpus=False, say=lambda _text: None,
                              after_facts=lambda _reports: False)
    assert report.stopped and [h.spec.name for h in report.hosts] == ["a", "b"]
    assert not slots.quarantined


def test_a_hosts_status_is_read_into_types_and_written_back_with_the_documented_keys(
        tmp_path: Path) -> None:
    found = HostStatus.from_json({"python": "3.11.2", "machine": "x86_64", "system": "Linux",
                                  "libc": "glibc 2.36", "workdir": "/w",
                                  "env": {"path": "/w/envs/x", "python": "3.11.2",
                                          "dists": ["numpy==2.3.4"]},
                                  "host_packages": {"torch": "2.13.0"}})
    assert found.env == Built("/w/envs/x", "3.11.2", ("numpy==2.3.4",))
    assert found.host_packages == {"torch": "2.13.0"} and found.interface_address is None
    assert found.drift(["numpy==2.3.4"]) == []
    assert found.drift(["numpy==2.4.0"]) == ["numpy 2.3.4 instead of 2.4.0"]
    assert HostStatus.from_json({"python": "3.11.2", "env": None}).drift(["numpy==2.3.4"]) == [
        "not built"]
    assert HostStatus.from_json({}) == HostStatus()  # a status that said nothing: unknown

    (tmp_path / "req.lock").write_text("numpy==2.3.4\n")
    (tmp_path / "inv.yaml").write_text("defaults:\n  environment: req.lock\n"
                                       "hosts:\n  - host: 10.0.0.1\n    name: n1\n")
    host = sync.HostEnv(inventory.load(tmp_path / "inv.yaml").hosts[0], state=sync.READY,
                        status={"workdir": "/w", "env": {"python": "3.11.2", "dists": []}})
    shown = host.as_json()
    # docs/commands.md: `env --json`'s host object, key by key.
    assert list(shown) == ["name", "state", "lock", "path", "platform", "hash", "drift",
                           "problem", "received_bytes", "fetched_bytes", "build_seconds",
                           "lock_packages", "host_packages"]
    assert shown["path"] == f"/w/envs/{host.env.digest}" and isinstance(shown["hash"], str)
