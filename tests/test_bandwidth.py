"""`check --bandwidth`: each worker's TCP throughput to the master, one worker at a time, with a
warning below 10 Gbit/s; and with `--smoke`, the all-reduce's bus bandwidth.

Fast tier: the busbw formula, the judging in clusterrun/preflight/bandwidth.py on fake probe
sessions, and clusterrun/remote/probe/throughput.py over loopback (real sockets, real probes).
Cluster tier: one worker among node9-node12 held to 500 Mbit/s with `tc tbf`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from clusterrun.errors import Outcome
from clusterrun.launch import smoke
from clusterrun.preflight import bandwidth
from clusterrun.preflight.probe_session import ProbeSession
from clusterrun.preflight.report import HostReport
from clusterrun.remote.probe import throughput
from clusterrun.transport.local import LocalTransport
from clusterrun.transport.programs import ProgramError
from tests.conftest import LOCAL_SPEC, Cluster, host_spec, run_cli

# Not an address this host holds, and where nothing can be sent either: IPv6 link-local on
# the loopback device (the kernel refuses both bind and connect with EINVAL, and where IPv6 is
# off the socket cannot even be made). Never an address of another machine.
UNBINDABLE = "fe80::1%lo"

# --- the bus bandwidth of the smoke all-reduce


def _allreduce() -> ModuleType:
    spec = importlib.util.spec_from_file_location("smoke_allreduce", smoke.SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # torch is imported in main(), not here
    return module


def test_bus_bandwidth_is_size_over_time_times_2_n_minus_1_over_n() -> None:
    busbw = _allreduce().bus_bandwidth
    assert busbw(256e6, 1.0, 2) == pytest.approx(256e6)  # 2(n-1)/n = 1
    assert busbw(256e6, 0.5, 4) == pytest.approx(512e6 * 1.5)
    assert busbw(100e6, 1.0, 64) == pytest.approx(100e6 * 2 * 63 / 64)
    assert busbw(256e6, 1.0, 1) == 0.0  # one rank: nothing crosses a link
    assert busbw(256e6, 0.0, 4) == 0.0


def test_bus_bandwidth_line_warns_below_10_gbit() -> None:
    line = _allreduce().bandwidth_line
    slow = line(256 << 20, 1.0, 4)  # 268 MB/s x 1.5 = 0.40 GB/s = 3.22 Gbit/s
    assert "across 4 ranks" in slow and "algbw 0.27 GB/s" in slow
    assert "bus bandwidth 0.40 GB/s (3.22 Gbit/s)" in slow
    assert "warning: below 10 Gbit/s" in slow
    fast = line(256 << 20, 0.1, 4)
    assert "(32.21 Gbit/s)" in fast and "warning" not in fast


def test_smoke_size_defaults_to_256_mb_and_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(smoke.BYTES_ENV, raising=False)
    assert smoke.bandwidth_bytes() == 256 << 20
    monkeypatch.setenv(smoke.BYTES_ENV, "1000000")
    assert smoke.bandwidth_bytes() == 1_000_000
    monkeypatch.setenv(smoke.BYTES_ENV, "lots")
    with pytest.raises(Exception, match="CLUSTERRUN_SMOKE_BYTES='lots'"):
        smoke.bandwidth_bytes()


# --- measure(): the judging, on fake probe sessions


class FakeSession:
    """Answers ``sink`` and ``blast`` from a script, and records every question asked."""

    def __init__(self, name: str, log: list[tuple[str, str, dict[str, Any]]],
                 reply: Any = None, delay: float = 0.0) -> None:
        self.name, self.log, self.reply, self.delay = name, log, reply, delay

    def ask(self, op: str, **fields: Any) -> Any:
        self.log.append((self.name, op, fields))
        time.sleep(self.delay)
        if isinstance(self.reply, Exception):
            raise self.reply
        if op == "sink":
            return self.reply or {"ok": True, "port": 40000}
        return self.reply


def _reports(*names: str) -> list[HostReport]:
    reports = []
    for rank, name in enumerate(names):
        report = HostReport(host_spec(f"10.0.0.{rank + 1}", name, master=rank == 0), rank)
        report.interface, report.address = "eth0", f"10.0.0.{rank + 1}"
        reports.append(report)
    return reports


def _rate(gbit: float) -> dict[str, Any]:
    return {"ok": True, "bytes": int(gbit * 1e9 / 8), "sent": int(gbit * 1e9 / 8),
            "seconds": 1.0}


def _check(report: HostReport) -> tuple[bool, str]:
    found = [c for c in report.checks if c.name == "bandwidth"]
    assert len(found) == 1, report.checks
    return found[0].ok, found[0].detail


def test_measure_warns_below_10_gbit_and_names_the_rate() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    reports = _reports("m", "fast", "slow")
    sessions = {"m": FakeSession("m", log), "fast": FakeSession("fast", log, _rate(24.0)),
                "slow": FakeSession("slow", log, _rate(0.48))}
    bandwidth.measure(reports, sessions, "10.0.0.1")  # type: ignore[arg-type]
    assert _check(reports[1]) == (True, "24.00 Gbit/s to m (10.0.0.1) from eth0 in 1.0 s")
    ok, detail = _check(reports[2])
    assert ok and detail.startswith("warning: 0.48 Gbit/s to m (10.0.0.1) from eth0 in 1.0 s")
    assert "below 10 Gbit/s" in detail and "slower than on one node" in detail
    assert reports[2].facts["bandwidth"] == {"gbit_s": 0.48, "bytes": 60_000_000,
                                             "seconds": 1.0}
    assert not any(c.name == "bandwidth" for c in reports[0].checks)  # the master: none
    # One sink on the master's address, then the workers one after the other, each sending
    # from its own chosen address.
    assert [(n, op) for n, op, _ in log] == [("m", "sink"), ("fast", "blast"), ("slow", "blast")]
    assert log[0][2]["addr"] == "10.0.0.1"
    assert log[2][2] == {"addr": "10.0.0.1", "port": 40000, "src": "10.0.0.3",
                         "seconds": bandwidth.SECONDS, "bytes": bandwidth.MAX_BYTES,
                         "timeout": bandwidth.WAIT_SECONDS}


def test_measure_fails_a_worker_that_cannot_connect_naming_the_pair() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    reports = _reports("m", "cut", "dead", "ok")
    refused = {"ok": False, "stage": "connect", "error": "timed out after 5 s"}
    died = ProgramError(Outcome.PROBE_FAILED, "dead: the probe exited with status 1")
    sessions = {"m": FakeSession("m", log), "cut": FakeSession("cut", log, refused),
                "dead": FakeSession("dead", log, died), "ok": FakeSession("ok", log, _rate(12))}
    bandwidth.measure(reports, sessions, "10.0.0.1")  # type: ignore[arg-type]
    ok, detail = _check(reports[1])
    assert not ok
    assert detail.startswith("cut (10.0.0.2) -> m (10.0.0.1): cannot connect to port 40000: "
                             "timed out after 5 s.")
    ok, detail = _check(reports[2])
    assert not ok and "dead (10.0.0.3) -> m (10.0.0.1)" in detail and "status 1" in detail
    assert _check(reports[3])[0] and "bandwidth" not in reports[1].facts


def test_measure_skips_hosts_that_cannot_be_measured() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    reports = _reports("m", "unprobed", "nopath", "noiface", "gone")
    reports[2].add("data_path", False, "cannot open a TCP connection")
    reports[3].interface = reports[3].address = None
    reports[4].fail(Outcome.CONNECT_TIMEOUT, "ssh", "timed out")
    sessions = {n: FakeSession(n, log, _rate(12)) for n in ("nopath", "noiface", "gone")}
    sessions["m"] = FakeSession("m", log)
    bandwidth.measure(reports, sessions, "10.0.0.1")  # type: ignore[arg-type]
    assert not any(c.name == "bandwidth" for c in reports[1].checks)  # no session: failed
    assert _check(reports[2]) == (True, "warning: not measured: no data path to the master")
    assert _check(reports[3]) == (True, "warning: not measured: no interface was chosen")
    assert [c.name for c in reports[4].checks] == ["ssh"]
    assert [op for _, op, _ in log] == ["sink"]


def test_measure_when_the_master_cannot_open_a_sink() -> None:
    log: list[tuple[str, str, dict[str, Any]]] = []
    reports = _reports("m", "w")
    sessions = {"m": FakeSession("m", log, {"ok": False, "error": "Address not available"}),
                "w": FakeSession("w", log, _rate(12))}
    bandwidth.measure(reports, sessions, "10.0.0.1")  # type: ignore[arg-type]
    assert _check(reports[1]) == (True, "warning: not measured: no port could be opened on the "
                                  "master at 10.0.0.1: Address not available")
    assert [op for _, op, _ in log] == ["sink"]


def test_measure_is_bounded_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bandwidth, "SECONDS", 0.1)
    monkeypatch.setattr(bandwidth, "budget", lambda workers: 0.5)
    log: list[tuple[str, str, dict[str, Any]]] = []
    reports = _reports("m", "w1", "w2", "w3")
    sessions: dict[str, Any] = {n: FakeSession(n, log, _rate(12), delay=0.3)
                                for n in ("w1", "w2", "w3")}
    sessions["m"] = FakeSession("m", log)
    bandwidth.measure(reports, sessions, "10.0.0.1")  # bounded: w3 is not measured
    assert _check(reports[1])[1].startswith("12.00 Gbit/s")
    assert _check(reports[2])[1].startswith("12.00 Gbit/s")
    assert _check(reports[3]) == (True, "warning: not measured: the measurement's 0 s were spent "
                                  "before this host's turn (hosts before it timed out)")


def test_budget_is_about_a_second_per_worker() -> None:
    assert 60 <= bandwidth.budget(50) - bandwidth.budget(0) <= 120


# --- clusterrun/remote/probe/throughput.py over loopback


@pytest.fixture
def sink() -> Iterator[throughput.Sink]:
    found = throughput.Sink("127.0.0.1", idle=2.0)
    yield found
    found.close()


def test_send_for_a_time_then_the_receiver_counts(sink: throughput.Sink) -> None:
    result = throughput.send_for("127.0.0.1", sink.port, "127.0.0.1", seconds=0.3)
    assert result["ok"], result
    assert result["bytes"] == result["sent"] > 0
    assert 0.3 <= result["seconds"] < 3
    deadline = time.monotonic() + 2
    while not sink.received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sink.received == [result["bytes"]]


def test_send_for_stops_at_max_bytes(sink: throughput.Sink) -> None:
    # An hour: a send that went on past max_bytes would run into pytest's own timeout.
    result = throughput.send_for("127.0.0.1", sink.port, seconds=3600, max_bytes=3_000_001)
    assert result["ok"] and result["bytes"] == result["sent"] == 3_000_001


def test_send_for_refused_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    result = throughput.send_for("127.0.0.1", port, timeout=1)
    assert result == {"ok": False, "stage": "connect", "error": "Connection refused"}


def test_send_for_a_receiver_that_stops_reading_is_bounded() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        accepted: list[socket.socket] = []
        threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
        result = throughput.send_for("127.0.0.1", server.getsockname()[1], seconds=3600,
                                     timeout=0.5)  # an hour: only the stall may end it
        for conn in accepted:
            conn.close()
    assert not result["ok"] and result["stage"] == "send", result
    assert "no progress for 0.5 s" in result["error"]


def test_sink_in_a_busy_probe_state_is_reused() -> None:
    state: dict[str, Any] = {}
    first = throughput.sink(state, {"addr": "127.0.0.1"})
    try:
        assert first["ok"] and throughput.sink(state, {"addr": "127.0.0.1"}) == first
        # Not an address this host holds: the kernel refuses it on the spot.
        assert throughput.sink({}, {"addr": UNBINDABLE})["ok"] is False
    finally:
        state["sink"].close()


def test_real_probes_measure_each_other_over_loopback(tmp_path: Path) -> None:
    """The ops as the controller asks them: two probes started through the local transport,
    shipped with throughput.py as they are to any host."""
    spec = dataclasses.replace(LOCAL_SPEC, workdir=str(tmp_path / "w"), python=sys.executable)
    master = ProbeSession(LocalTransport(spec), spec, 20)
    worker = ProbeSession(LocalTransport(spec), spec, 20)
    try:
        opened = master.ask("sink", addr="127.0.0.1", timeout=5)
        assert opened["ok"], opened
        reply = worker.ask("blast", addr="127.0.0.1", port=opened["port"], src="127.0.0.1",
                           seconds=0.2, bytes=bandwidth.MAX_BYTES, timeout=5)
        assert reply["ok"] and reply["bytes"] > 0 and reply["seconds"] >= 0.2, reply
    finally:
        master.close()
        worker.close()


# --- the namespace cluster: node9-node12, node11 held to 500 Mbit/s

HOSTS = ["node9", "node10", "node11", "node12"]
LIMITED = "node11"


@pytest.fixture
def limited(cluster: Cluster) -> Iterator[str]:
    """LIMITED's NIC sends at most 500 Mbit/s (what it sends to the master), until the end."""
    ifname = cluster.host(LIMITED).ifname
    cluster.run_on(LIMITED, "tc", "qdisc", "add", "dev", ifname, "root", "tbf", "rate",
                   "500mbit", "burst", "64kb", "latency", "50ms")
    try:
        yield LIMITED
    finally:
        cluster.run_on(LIMITED, "tc", "qdisc", "del", "dev", ifname, "root")


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    """Whatever a failed test leaves on HOSTS is killed, so it cannot fail the next one."""
    yield
    cluster.kill_all(HOSTS)


def _bandwidth_checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: c for h in report["hosts"] for c in h["checks"] if c["name"] == "bandwidth"}


def _gbit(detail: str) -> float:
    match = re.search(r"([\d.]+) Gbit/s to node9 \(", detail)
    assert match, detail
    return float(match.group(1))


@pytest.mark.cluster
def test_a_slow_link_is_named_with_its_rate(cluster: Cluster, tmp_path: Path, limited: str,
                                           strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    start = time.monotonic()
    cp = run_cli("check", "--bandwidth", "--json", str(inv), timeout=120)
    took = time.monotonic() - start
    report = json.loads(cp.stdout)
    assert cp.returncode == 0 and report["ok"], cp.stdout[-3000:] + cp.stderr[-2000:]
    checks = _bandwidth_checks(report)
    assert sorted(checks) == ["node10", "node11", "node12"]  # the workers; not the master
    slow = checks[limited]
    assert slow["ok"] and slow["detail"].startswith("warning: ")
    assert "below 10 Gbit/s: multi-node training over this link may be slower" in slow["detail"]
    assert 0.2 < _gbit(slow["detail"]) < 0.55, slow  # tbf's 500 Mbit/s, not more
    assert f"from {cluster.host(limited).ifname} in " in slow["detail"]
    for name in ("node10", "node12"):
        detail = checks[name]["detail"]
        rate = _gbit(detail)
        assert checks[name]["ok"] and rate > 2 * _gbit(slow["detail"]), detail
        # Warned exactly when what it achieved is below the threshold.
        assert detail.startswith("warning: ") == (rate < 10), detail
    assert took < 60, took  # three workers, about a second each, plus the usual checks

    plain = run_cli("check", "--bandwidth", str(inv), timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    warned = [line for line in plain.stdout.splitlines() if "bandwidth: warning:" in line]
    assert any(re.search(r"bandwidth: warning: 0\.\d+ Gbit/s to node9 \([\d.]+\) from \w+ in",
                         line) for line in warned), plain.stdout
    # The host a problem line is about: named at its start (`node11: bandwidth: ...`), or else
    # the host line it is indented under.
    named, current = [], ""
    for line in plain.stdout.splitlines():
        if not line.startswith(" "):
            current = line.split(" ")[0]
            continue
        found = re.match(r"\s*(?:(\S+): )?bandwidth: warning: 0\.", line)
        if found:
            named.append(found.group(1) or current)
    assert named == [limited], plain.stdout
    assert cluster.wait_no_processes(HOSTS, 10) == {}


@pytest.mark.cluster
def test_smoke_with_bandwidth_prints_the_bus_bandwidth(cluster: Cluster, home: Path,
                                                       tmp_path: Path, strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    cp = run_cli("check", "--smoke", "--bandwidth", str(inv), timeout=240,
                 env={"CLUSTERRUN_SMOKE_BYTES": str(32 << 20)})
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    found = re.search(r"\[node9 r0\] all-reduce of 34 MB across 4 ranks: ([\d.]+) ms, "
                      r"algbw ([\d.]+) GB/s, bus bandwidth ([\d.]+) GB/s \(([\d.]+) Gbit/s\)",
                      cp.stdout)
    assert found, cp.stdout[-3000:]
    ms, algbw, busbw, gbit = (float(g) for g in found.groups())
    assert ms > 0 and busbw > 0
    assert busbw == pytest.approx(algbw * 2 * 3 / 4, abs=0.02)
    assert gbit == pytest.approx(busbw * 8, abs=0.05)
    assert len(re.findall(r"bus bandwidth", cp.stdout)) == 1  # rank 0 only
    assert cluster.wait_no_processes(HOSTS, 15) == {}
