"""Which hosts run each attempt of a restarted run (clusterrun/inventory/slots.py): spares take a
failed host's node rank, --min-nodes shrinks the run, and the first host is the master."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.inventory import slots as restarts
from tests.conftest import fake_inventory, host_spec


def inventory(tmp_path: Path, spares: int = 1):
    hosts = [host_spec(f"10.0.0.{n}", f"gpu{n}", master=n == 1) for n in range(1, 4)]
    hosts += [host_spec(f"10.0.1.{n}", f"spare{n}", spare=True) for n in range(1, spares + 1)]
    return fake_inventory(tmp_path, *hosts)


def test_spares_wait_and_take_the_failed_hosts_node_rank(tmp_path: Path) -> None:
    inv = inventory(tmp_path, spares=2)
    slots = restarts.Slots.initial(inv)
    assert [h.name for h in slots.hosts] == ["gpu1", "gpu2", "gpu3"]
    said = slots.leave_out("gpu2", "lost (no word for 30 s)", attempt=1)
    assert said == "gpu2 lost (no word for 30 s); replaced by spare spare1"
    assert [h.name for h in slots.hosts] == ["gpu1", "spare1", "gpu3"]
    [q] = slots.quarantined
    assert (q.host, q.reason, q.attempt) == ("gpu2", "lost (no word for 30 s)", 1)


def test_a_lost_master_is_replaced_and_the_spare_becomes_the_master(tmp_path: Path) -> None:
    slots = restarts.Slots.initial(inventory(tmp_path))
    said = slots.leave_out("gpu1", "is unreachable", attempt=2)
    assert said.endswith("replaced by spare spare1 (the new master)")
    attempt = slots.inventory(inventory(tmp_path))
    assert [(h.name, h.master) for h in attempt.hosts] == [
        ("spare1", True), ("gpu2", False), ("gpu3", False)]


def test_without_spares_min_nodes_shrinks_the_run_or_it_cannot_restart(tmp_path: Path) -> None:
    slots = restarts.Slots.initial(inventory(tmp_path, spares=0), min_nodes=2)
    assert "going on with 2 nodes (--min-nodes 2)" in slots.leave_out("gpu3", "lost", 1)
    assert [h.name for h in slots.hosts] == ["gpu1", "gpu2"]
    with pytest.raises(restarts.CannotReplace, match=r"no spare left.*no fewer than 2 nodes"):
        slots.leave_out("gpu2", "lost", 2)
    slots = restarts.Slots.initial(inventory(tmp_path, spares=0))
    with pytest.raises(restarts.CannotReplace, match="no --min-nodes"):
        slots.leave_out("gpu2", "lost", 1)
