"""`clusterrun top` without a cluster: the sampler program run here with the fake nvidia-smi
(tests/fakes), the rank flags, the JSON shape and the drawn view."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from clusterrun.observe.frame import LOST, OK, Frame, HostSample, RankSample, flag_ranks
from clusterrun.observe.view import render
from clusterrun.transport import shell

FAKES = Path(__file__).resolve().parent / "fakes"


class Sampler:
    """remote/tools/sampler.py as a host runs it: shipped on stdin, one request per line."""

    def __init__(self, request: dict[str, Any], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-u", "-c", shell.BOOTSTRAP],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, **env})
        assert self.proc.stdin is not None
        self.proc.stdin.write(shell.program_input("sampler.py", request))
        self.proc.stdin.flush()
        self.seq = 0

    def sample(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.seq += 1
        self.proc.stdin.write(b'{"seq": %d}\n' % self.seq)
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line.startswith(b"J "), line
        reply: dict[str, Any] = json.loads(line[2:])
        assert reply["seq"] == self.seq
        return reply

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # EOF: the sampler exits
        return self.proc.wait(10)


@pytest.fixture
def gpu_state(tmp_path: Path) -> Path:
    state = {"gpus": [
        {"utilization.gpu": 97, "memory.used": 40000, "temperature.gpu": 71, "power.draw": 612.3,
         "clocks_throttle_reasons.active": "0x0000000000000044"},
        {"utilization.gpu": 3, "memory.used": 100, "temperature.gpu": 40, "power.draw": "[N/A]",
         "ecc.errors.uncorrected.volatile.total": 2}]}
    path = tmp_path / "nvidia-smi.json"
    path.write_text(json.dumps(state))
    return path


@pytest.fixture
def rundir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank-0.log").write_text("starting\nstep 1\rstep 1 50%\rstep 1 100%\n")
    return folder


@pytest.fixture
def smi_path(tmp_path: Path) -> str:
    """A PATH with the fake nvidia-smi first, run by this interpreter: through its own
    ``#!/usr/bin/env python3`` it may start a version manager's shim (pyenv's takes a lock),
    and a loaded machine then runs past the sampler's limit for an answer."""
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "nvidia-smi"
    body = (FAKES / "nvidia-smi").read_text().split("\n", 1)[1]
    fake.write_text(f"#!{sys.executable} -S\n{body}")
    fake.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def gpus_of(sampler: Sampler) -> list[dict[str, Any]]:
    """The GPUs of the first sample that has them: nvidia-smi runs on the sampler's own thread,
    so the first samples may come before its first answer. Bounded only against a hang."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found: list[dict[str, Any]] = sampler.sample()["host"]["gpus"] or []
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("no GPU figures from the fake nvidia-smi")


def test_the_sampler_reads_gpus_from_nvidia_smi(gpu_state: Path, rundir: Path,
                                                smi_path: str) -> None:
    sampler = Sampler({"rundir": str(rundir), "interface": "lo", "ranks": [0, 0]},
                      {"PATH": smi_path,
                       "FAKE_NVIDIA_SMI_STATE": str(gpu_state)})
    try:
        first, second = gpus_of(sampler)
        assert first == {"index": 0, "util_percent": 97, "mem_used_mb": 40000,
                         "mem_total_mb": 81559, "temp_c": 71, "power_w": 612.3,
                         "throttle": ["sw_power_cap", "hw_thermal"], "ecc_errors": 0}
        assert second["power_w"] is None and second["ecc_errors"] == 2
        assert second["throttle"] == []  # 0x1 is "idle": not a slowdown
        reply = sampler.sample()
        host = reply["host"]
        assert host["mem_total_mb"] > 0 and host["interface_found"] is True
        assert host["state"] == "missing"  # no state.json: no supervisor has run here
        rank = reply["ranks"][0]
        assert rank["pid"] is None  # no launcher: no rank process claimed
        assert rank["last_line"] == "step 1 100%"  # a progress bar's last frame
    finally:
        assert sampler.close() == 0


def test_an_old_driver_without_throttle_reasons_still_gives_the_rest(
        gpu_state: Path, rundir: Path, smi_path: str) -> None:
    state = json.loads(gpu_state.read_text())
    state["unsupported"] = ["clocks_throttle_reasons.active"]
    gpu_state.write_text(json.dumps(state))
    sampler = Sampler({"rundir": str(rundir), "interface": "lo", "ranks": [0, 0]},
                      {"PATH": smi_path, "FAKE_NVIDIA_SMI_STATE": str(gpu_state)})
    try:
        first = gpus_of(sampler)[0]
        assert first["util_percent"] == 97 and first["throttle"] is None
    finally:
        sampler.close()


def test_a_slow_nvidia_smi_is_asked_the_whole_query_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query with no answer in time (a loaded host) is asked whole next time; only a driver
    that refuses a field makes the sampler drop the newer ones (GPU_BASIC) for good."""
    from clusterrun.remote.probe import nvidia
    from clusterrun.remote.tools import sampler

    answers = [(None, nvidia.NO_ANSWER % nvidia.QUERY_SECONDS),
               ("0, 97, 40000, 81559, 71, 612.3, 0x0000000000000044, 0\n", None)]
    asked: list[int] = []

    def smi(argv: list[str], timeout: float = nvidia.QUERY_SECONDS) -> tuple[Any, Any]:
        asked.append(argv[0].count(","))
        return answers.pop(0)

    monkeypatch.setattr(nvidia, "nvidia_smi", smi)
    poll = sampler.GpuPoll()  # type: ignore[no-untyped-call]
    poll.query()
    assert poll.latest is None and poll.error == "nvidia-smi gave no answer within 8 s"
    poll.query()
    assert asked == [len(sampler.GPU_QUERY) - 1] * 2  # the whole query, both times
    assert poll.latest[0]["throttle"] == ["sw_power_cap", "hw_thermal"] and poll.error is None


def test_lines_per_minute_counts_what_a_log_gained(rundir: Path) -> None:
    began = time.monotonic()
    sampler = Sampler({"rundir": str(rundir), "ranks": [0, 0]}, {"PATH": "/usr/bin:/bin"})
    try:
        sampler.sample()  # it has started, and counts from here
        counting = time.monotonic()
        with (rundir / "rank-0.log").open("a") as log:
            log.write("".join(f"line {i}\n" for i in range(30)))
        time.sleep(0.5)  # not a wait for anything: the span the rate is taken over, at least
        asked = time.monotonic()
        rank = sampler.sample()["ranks"][0]
        answered = time.monotonic()
        # 30 lines since the sampler's first look: that look came after `began` and before
        # `counting`, this one between `asked` and `answered` (the sampler reads the same
        # monotonic clock). Exact however long each step took on a loaded machine.
        slowest, fastest = 30 * 60 / (answered - began), 30 * 60 / (asked - counting)
        assert slowest - 0.1 <= rank["lines_per_min"] <= fastest + 0.1, (slowest, rank, fastest)
        # Silent since the lines were written: at most the time from then to the answer.
        since_written = time.time() - (rundir / "rank-0.log").stat().st_mtime
        assert rank["last_line"] == "line 29" and 0 <= rank["silent_s"] <= since_written + 0.1
        assert sampler.sample()["host"]["gpus"] is None  # no nvidia-smi on this PATH
    finally:
        sampler.close()


def test_the_rate_is_over_the_last_minute_at_any_clock(tmp_path: Path, clock_base: float) -> None:
    """Lines per minute count over the looks of the last RATE_WINDOW seconds, whatever the clock
    reads: a burst of 30 lines before the look at 2 s, then 5 lines before each look, every 2 s.
    At 62 s the look at 0 s, 62 s back, has left the window (the one at 2 s is exactly 60 s back,
    float rounding aside): 150 lines in the last minute, not 180 in 62 s."""
    from clusterrun.remote.tools import sampler

    log = tmp_path / "rank-0.log"
    log.write_text("starting\n")
    rate = sampler.LogRate(str(log))  # type: ignore[no-untyped-call]
    t0 = clock_base + 100
    rate.look(t0)
    for look in range(1, 32):
        with log.open("a") as out:
            out.write("step\n" * (30 if look == 1 else 5))
        got = rate.look(t0 + 2 * look)
    assert got["lines_per_min"] == pytest.approx(150.0)


def ranks(*rates: float, silent: tuple[float, ...] = ()) -> list[RankSample]:
    return [RankSample(rank=i, node="n", lines_per_min=r,
                       silent_s=silent[i] if silent else 1.0) for i, r in enumerate(rates)]


def test_flags_name_the_rank_that_falls_behind() -> None:
    even = ranks(60, 62, 59, 61)
    flag_ranks(even)
    assert [r.flags for r in even] == [[], [], [], []]
    slow = ranks(60, 62, 20, 61)
    flag_ranks(slow)
    assert [r.flags for r in slow] == [[], [], ["slow"], []]
    # Only rank 0 prints (a common script): the quiet ranks are not slow.
    quiet = ranks(60, 0, 0, 0)
    flag_ranks(quiet)
    assert [r.flags for r in quiet] == [[], [], [], []]
    stopped = ranks(60, 60, 0, 60, silent=(1, 1, 95, 2))
    flag_ranks(stopped)
    assert stopped[2].flags == ["silent"]


def frame() -> Frame:
    hosts = [HostSample(node="gpu-a", status=OK, node_state="running", cpu_percent=12.5,
                        mem_used_mb=2048, mem_total_mb=16384, load=[0.5, 0.4, 0.3],
                        interface="ens5", net_rx_mbps=1.5, net_tx_mbps=1.25,
                        disk_free_mb=10240),
             HostSample(node="gpu-b", status=LOST, reason="no answer for 5 s")]
    ranked = [RankSample(rank=0, node="gpu-a", pid=42, cpu_percent=99.0, rss_mb=300.0,
                         lines_per_min=60.0, last_line="epoch 1 loss 0.4", silent_s=0.5),
              RankSample(rank=1, node="gpu-b")]
    return Frame(run="r1", run_state="stalled", interval=2.0, hosts=hosts, ranks=ranked)


def test_the_json_has_exactly_the_documented_shape() -> None:
    out = frame().to_json()
    assert set(out) == {"run", "hosts", "ranks"}
    assert set(out["hosts"][0]) == {"node", "cpu_percent", "mem_used_mb", "mem_total_mb",
                                    "net_rx_mbps", "net_tx_mbps", "gpus"}
    assert set(out["ranks"][0]) == {"rank", "node", "pid", "cpu_percent", "rss_mb",
                                    "lines_per_min", "last_line", "silent_s"}
    assert out["hosts"][1]["cpu_percent"] is None and out["ranks"][1]["pid"] is None


def test_the_view_shows_a_stalled_run_and_a_lost_host() -> None:
    console = Console(width=120, record=True, color_system=None)
    console.print(render(frame()))
    text = console.export_text()
    assert "clusterrun top r1  STALLED" in text and "1 host lost" in text
    assert re.search(r"gpu-b +LOST +no answer for 5 s", text), text
    assert "epoch 1 loss 0.4" in text and "ens5" in text


def test_top_follows_a_restarted_run_to_its_new_hosts(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      clock_base: float) -> None:
    from clusterrun.observe import watch as watching
    from clusterrun.runs import attempts, store
    from clusterrun.transport import SshOptions

    opened: list[str] = []
    monkeypatch.setattr(watching.Link, "open", lambda link: opened.append(link.name))
    run = store.create(tmp_path, "20260101-000000-train-abcd")

    def plan(folder: store.RunDir, *hosts: str) -> None:
        nodes = [{"host": f"10.0.0.{i + 1}", "name": name, "node_rank": i, "ranks": [i, i],
                  "rundir": f"/tmp/clusterrun/runs/x/{name}", "interface": "eth0"}
                 for i, name in enumerate(hosts)]
        store.write_json(folder.file("plan.json"), {"nodes": nodes, "world_size": len(hosts)})

    plan(run, "gpu-a", "gpu-b")
    watch = watching.Watch(run, SshOptions(), 0.2)
    watch.start()
    # Attempt 2 runs on a spare in gpu-b's place.
    plan(attempts.create_attempt(run, 2), "gpu-a", "gpu-c")
    store.write_json(run.file("state.json"), {"state": "running", "attempt": 2})
    frame = watch.refresh(wait=0)
    assert [h.node for h in frame.hosts] == ["gpu-a", "gpu-c"]
    deadline = time.monotonic() + 5
    while len(opened) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(opened) == ["gpu-a", "gpu-a", "gpu-b", "gpu-c"]


class _Ended:
    """A connection or a channel that remembers being closed (silent until then)."""

    def __init__(self) -> None:
        import threading

        self.ended = threading.Event()

    @property
    def closed(self) -> bool:
        return self.ended.is_set()

    def run(self, _command: str) -> _Ended:
        self.channel = _Ended()
        return self.channel

    def recv(self, _size: int) -> bytes:
        self.ended.wait(5)
        return b""

    def close_stdin(self) -> None:
        pass

    def close(self) -> None:
        self.ended.set()


def test_a_host_that_connects_after_top_let_it_go_is_not_left_connected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart moves `top` to new hosts (or the user quits) while a host is still being
    connected on its own thread: the connection, once made, is ended, not kept for nobody."""
    import threading

    from clusterrun.inventory import HostSpec
    from clusterrun.observe import watch as watching
    from clusterrun.runs.records import PlanNode
    from clusterrun.transport import SshOptions

    release = threading.Event()
    made: list[_Ended] = []

    def connect(_spec: Any, _ssh: Any) -> _Ended:
        release.wait(5)
        made.append(_Ended())
        return made[-1]

    monkeypatch.setattr(watching, "connect", connect)
    monkeypatch.setattr(watching, "drain", lambda _proc, _limit: (None, bytearray()))
    monkeypatch.setattr(watching, "send", lambda *_args: None)
    spec = HostSpec(host="10.0.0.1", name="gpu-a", master=True, line=1)
    node = PlanNode("gpu-a", "10.0.0.1", 0, (0, 0), rundir="/tmp/r/gpu-a")
    link = watching.Link(spec, node, SshOptions())
    opening = threading.Thread(target=link.open)
    opening.start()
    link.close()  # while it connects
    release.set()
    opening.join(5)
    assert made and made[0].closed and made[0].channel.closed
    assert link.proc is None and link.transport is None
