"""A macOS laptop as the controller, faked here on Linux: its sleep is seen on a clock that
counts sleep there, its py-spy (a Mach-O program) is never shipped to Linux hosts, and the
localhost demo, whose nodes need Linux, stops at once with the reason and the fix."""

from __future__ import annotations

import io
import json
import os
import platform
import struct
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun import pyspy
from clusterrun.cli import main
from clusterrun.errors import ExitStatus, InventoryError
from clusterrun.launch import pause
from clusterrun.launch.session import Session
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.remote.shared.protocol import EVENT
from clusterrun.remote.tools import stackdump as remote_stacks
from clusterrun.runs.records import PlanNode
from clusterrun.stacks import collect
from clusterrun.transport.local import require_linux
from clusterrun.wire import End
from tests.conftest import REPO, host_spec

# The clock ids as Python's time module has them on each system.
MAC_MONOTONIC, MAC_UPTIME_RAW = 6, 8
LINUX_MONOTONIC, LINUX_BOOTTIME = 1, 7


class Clocks:
    """A machine's clocks: ``sleep`` moves only those that count sleep."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, system: str, counting: set[int],
                 stopping: set[int], monotonic: int) -> None:
        self.now = dict.fromkeys(counting | stopping, 1000.0)
        self.counting = counting
        monkeypatch.setattr(sys, "platform", system)
        monkeypatch.setattr(time, "clock_gettime", lambda clock: self.now[clock])
        # time.monotonic is one of the clocks that stop (Linux: CLOCK_MONOTONIC, macOS:
        # mach_absolute_time, the same as CLOCK_UPTIME_RAW).
        monkeypatch.setattr(time, "monotonic", lambda: self.now[monotonic])

    def run(self, seconds: float) -> None:
        self.now = {k: v + seconds for k, v in self.now.items()}

    def sleep(self, seconds: float) -> None:
        self.now = {k: v + (seconds if k in self.counting else 0) for k, v in self.now.items()}


@pytest.fixture
def mac(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", MAC_MONOTONIC, raising=False)
    monkeypatch.setattr(time, "CLOCK_UPTIME_RAW", MAC_UPTIME_RAW, raising=False)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    return Clocks(monkeypatch, "darwin", {MAC_MONOTONIC}, {MAC_UPTIME_RAW}, MAC_UPTIME_RAW)


def slept(clocks: Clocks, seconds: float) -> Optional[tuple[float, float]]:
    """What the watch loop sees after the machine slept ``seconds`` between two turns."""
    found = pause.Pauses()
    found.beating()
    assert found.turn() is None
    clocks.run(0.2)
    assert found.turn() is None
    clocks.sleep(seconds)
    return found.turn()


def test_a_sleeping_mac_is_seen_on_its_clock_that_counts_sleep(mac: Clocks) -> None:
    """Apple's clock_gettime(3): CLOCK_MONOTONIC "will continue to increment while the system
    is asleep"; time.monotonic (mach_absolute_time) and CLOCK_UPTIME_RAW do not."""
    assert pause.sleep_clock() == MAC_MONOTONIC
    found = slept(mac, 600)
    assert found is not None and found[0] == pytest.approx(600, abs=1)
    text = pause.notice(*found, lease=30)
    assert text is not None and "suspended for 600 s" in text and "lease (30 s)" in text
    assert pause.unseen_sleep() is None


def test_linux_counts_sleep_on_boottime_never_on_its_monotonic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "CLOCK_BOOTTIME", LINUX_BOOTTIME, raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", LINUX_MONOTONIC, raising=False)
    clocks = Clocks(monkeypatch, "linux", {LINUX_BOOTTIME}, {LINUX_MONOTONIC}, LINUX_MONOTONIC)
    found = slept(clocks, 600)
    assert found is not None and found[0] == pytest.approx(600, abs=1)
    # Without CLOCK_BOOTTIME, Linux's CLOCK_MONOTONIC would miss the sleep: none is used.
    monkeypatch.delattr(time, "CLOCK_BOOTTIME")
    assert pause.sleep_clock() is None


@pytest.mark.parametrize(("system", "name"), [("freebsd14", "FreeBSD"), ("linux", "Linux")])
def test_without_a_clock_that_counts_sleep_the_controller_says_it_cannot_tell(
        monkeypatch: pytest.MonkeyPatch, system: str, name: str) -> None:
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", LINUX_MONOTONIC, raising=False)
    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(platform, "system", lambda: name)
    assert pause.sleep_clock() is None
    text = pause.unseen_sleep()
    assert text is not None
    assert f"cannot tell whether its machine slept ({name} offers no clock" in text


def _session(notes: list[str]) -> Session:
    node = NodePlan(name="node0", host="10.0.0.1", local=False, node_rank=0, nproc=1,
                    first_rank=0, interface="eth0", address="10.0.0.1", python="python3",
                    setup=None, workdir="/w", rundir="/w/r", cwd="/w/c", argv=(), env=())
    plan = LaunchPlan(run_id="r1", name="r1", script=Path("/t.py"), args=(),
                      master_addr="10.0.0.1", master_port=29500, nodes=(node,), sync=False,
                      grace=5, lease=30)
    return Session(plan, {}, {}, mirror=None, view=None, notify=notes.append)  # type: ignore[arg-type]


def test_nodes_that_lost_the_controller_are_not_left_to_blame_where_sleep_is_unseen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' lease ran out while this controller's clock saw no pause: where no clock
    counts sleep, the user hears that this machine may have slept, once."""
    lost = End(40.0, "lost", reason="lifeline lost: no heartbeat from the controller for 30 s",
               cause="lease_expired")
    monkeypatch.setattr(pause, "sleep_clock", lambda: None)
    notes: list[str] = []
    session = _session(notes)
    session.handle("node0", lost, 0.0)
    session.handle("node0", lost, 0.0)
    assert len(notes) == 1 and "cannot tell whether its machine slept" in notes[0]
    monkeypatch.setattr(pause, "sleep_clock", lambda: LINUX_BOOTTIME)
    notes.clear()
    _session(notes).handle("node0", lost, 0.0)  # its clock would have seen the sleep
    assert notes == []


# -- py-spy: the binary's own header says where it runs ---------------------------------------

def elf(machine: int, *, osabi: int = 0, order: str = "<") -> bytes:
    data = 1 if order == "<" else 2
    return (b"\x7fELF" + bytes([2, data, 1, osabi]) + bytes(8)
            + struct.pack(order + "HH", 2, machine) + bytes(44))


def macho(cputype: int) -> bytes:
    return b"\xcf\xfa\xed\xfe" + struct.pack("<I", cputype) + bytes(24)


@pytest.mark.parametrize(("head", "kind"), [
    (elf(62), ("Linux", "x86_64")),
    (elf(183), ("Linux", "aarch64")),
    (elf(21, order="<"), ("Linux", "ppc64le")),
    (elf(62, osabi=9), ("FreeBSD", "x86_64")),
    (macho(0x01000007), ("Darwin", "x86_64")),
    (macho(0x0100000C), ("Darwin", "aarch64")),
    (b"\xca\xfe\xba\xbe" + bytes(28), ("Darwin", "universal")),
    (b"#!/bin/sh\nexec pyenv ...", (None, None)),  # a shim, not the program
], ids=["elf-x86_64", "elf-aarch64", "elf-ppc64le", "elf-freebsd", "macho-x86_64",
        "macho-arm64", "macho-fat", "script"])
def test_the_header_says_the_system_and_cpu(head: bytes, kind: tuple[str, str]) -> None:
    assert pyspy.header_kind(head) == kind


def test_what_fits_a_host_is_the_same_system_and_cpu(tmp_path: Path) -> None:
    intel_mac = binary(tmp_path, macho(0x01000007))
    assert not intel_mac.fits("Linux", "x86_64")  # the same CPU, another system
    assert intel_mac.fits("Darwin", "x86_64")
    arm_linux = binary(tmp_path, elf(183))
    assert arm_linux.fits("Linux", "aarch64") and arm_linux.fits("Linux", "arm64")
    assert not arm_linux.fits("Linux", "x86_64") and not arm_linux.fits(None, None)
    assert not binary(tmp_path, b"#!/bin/sh\n").fits("Linux", "x86_64")


def binary(tmp_path: Path, head: bytes) -> pyspy.Binary:
    path = tmp_path / f"py-spy-{len(list(tmp_path.iterdir()))}"
    path.write_bytes(head + b"rest of the program")
    return pyspy.read(str(path))


class Host:
    """stacks.py on a Linux x86_64 host without py-spy: the requests it got."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, Any], Optional[list[bytes]]]] = []

    def call(self, _transport: Any, _spec: Any, program: str, request: dict[str, Any],
             **kw: Any) -> dict[str, Any]:
        assert program == "stackdump.py"
        self.requests.append((dict(request), kw.get("payload")))
        have = bool(request.get("send"))
        return {"found": True, "ranks": [{"rank": 0}] if have else [], "need_pyspy": not have,
                "system": "Linux", "machine": "x86_64"}


@pytest.mark.parametrize(("head", "shipped"), [(macho(0x01000007), False), (elf(62), True)],
                         ids=["mach-o", "elf"])
def test_an_intel_macs_py_spy_is_not_shipped_to_linux_hosts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, head: bytes, shipped: bool) -> None:
    """The controller's machine type is x86_64 either way (platform.machine() on an Intel Mac):
    only the binary's header tells a Mach-O program from an ELF one."""
    host = Host()
    spy = binary(tmp_path, head)
    monkeypatch.setattr(pyspy, "local", lambda: spy)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(collect, "call", host.call)
    spec = host_spec("10.0.0.5", "gpu-a")
    node = PlanNode("gpu-a", "10.0.0.5", 0, (0, 0), rundir="/w/runs/r1/gpu-a")
    reply = collect.ask(None, spec, node)  # type: ignore[arg-type]
    sent = [payload for request, payload in host.requests if request.get("send")]
    if shipped:
        assert sent == [[Path(spy.path).read_bytes()]] and not reply.get("problem")
        return
    assert sent == [] and len(host.requests) == 1
    assert reply["problem"] == (
        f"gpu-a: py-spy is not installed there, and this machine's ({spy.path}) is a macOS "
        "(Mach-O) x86_64 program, which a Linux x86_64 host cannot run; install py-spy in the "
        "host's Python environment (pip install py-spy)")


def test_the_host_reports_its_system_and_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the controller compares the binary with comes from the host's own uname."""
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"buffer": out})())
    request = {"rundir": str(tmp_path / "none"), "tools": str(tmp_path / "tools")}
    remote_stacks.main(io.BytesIO(json.dumps(request).encode() + b"\n"))
    line = out.getvalue()
    assert line.startswith(EVENT)
    answer = json.loads(line[len(EVENT):])
    assert (answer["system"], answer["machine"]) == (os.uname().sysname, os.uname().machine)


# -- the localhost demo: Linux only ---------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["launch", "inventories/localhost.yaml", "payloads/train_digits.py"],
    ["check", "inventories/localhost.yaml"],
    ["exec", "inventories/localhost.yaml", "--", "true"],
], ids=["launch", "check", "exec"])
def test_the_demo_on_a_mac_stops_before_anything_with_the_reason(
        mac: Clocks, home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert err == (
        "clusterrun: error: inventories/localhost.yaml: node[0-1] are local nodes (host: "
        "localhost), run on this machine without SSH, and a local node needs Linux "
        "(clusterrun's host side reads /proc there); this machine is Darwin. Run the demo on a "
        "Linux machine or VM, or list Linux hosts reached over SSH in the inventory: this "
        "machine can drive them as the controller.\n")
    assert not home.exists()  # no run was recorded, nothing was started


def test_only_local_nodes_outside_a_container_need_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    local = host_spec("localhost", "node0")
    boxed = host_spec("localhost", "node1", container="trainer")
    remote = host_spec("10.0.0.5", "gpu-a")
    monkeypatch.setattr(sys, "platform", "darwin")
    require_linux([boxed, remote], "inv.yaml")  # their host side runs in Linux
    with pytest.raises(InventoryError, match=r"inv.yaml: node0 is a local node"):
        require_linux([local, remote], "inv.yaml")
    monkeypatch.setattr(sys, "platform", "linux")
    require_linux([local], "inv.yaml")
