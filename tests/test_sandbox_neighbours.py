"""The sandbox makes room in the kernel's neighbour table for its mesh, and the last one down
puts the limits back (files standing in for /proc/sys and /run here; no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.sandbox import neighbours, net


@pytest.fixture
def limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sysctl = tmp_path / "sysctl"
    sysctl.mkdir()
    (sysctl / "gc_thresh2").write_text("512\n")
    (sysctl / "gc_thresh3").write_text("1024\n")
    monkeypatch.setattr(neighbours, "SYSCTL", sysctl)
    monkeypatch.setattr(net, "RUN_DIR", tmp_path / "run")
    (tmp_path / "run").mkdir()
    return sysctl


def values(sysctl: Path) -> tuple[int, int]:
    return int((sysctl / "gc_thresh2").read_text()), int((sysctl / "gc_thresh3").read_text())


def test_a_big_sandbox_raises_the_limits_and_the_last_one_down_restores_them(
        limits: Path) -> None:
    first, second = net.RUN_DIR / "aaaaaa", net.RUN_DIR / "bbbbbb"
    first.mkdir()
    neighbours.make_room(64)
    assert values(limits) == (2 * 64 * 64 // 2 + 512, 2 * 64 * 64 + 1024)
    second.mkdir()
    neighbours.make_room(128)
    assert values(limits) == (2 * 128 * 128 // 2 + 512, 2 * 128 * 128 + 1024)
    first.rmdir()
    neighbours.restore_if_last()  # the 128-host sandbox still needs the room
    assert values(limits) == (2 * 128 * 128 // 2 + 512, 2 * 128 * 128 + 1024)
    second.rmdir()
    neighbours.restore_if_last()
    assert values(limits) == (512, 1024)
    assert not (net.RUN_DIR / neighbours.SAVED).exists()


def test_small_sandboxes_and_roomy_machines_change_nothing(limits: Path) -> None:
    (net.RUN_DIR / "cccccc").mkdir()
    neighbours.make_room(8)
    assert values(limits) == (512, 1024)
    assert not (net.RUN_DIR / neighbours.SAVED).exists()
    (limits / "gc_thresh3").write_text("100000\n")
    (limits / "gc_thresh2").write_text("50000\n")
    neighbours.make_room(100)
    assert values(limits) == (50000, 100000)
