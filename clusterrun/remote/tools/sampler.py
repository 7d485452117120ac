"""`clusterrun top`'s sampler on one host of a run (stdlib only, Python 3.6+).

Started once per host and kept for as long as `top` watches: every line on stdin asks for one
sample, answered with one ``J <json>`` line; EOF ends it. It only reads /proc, /sys and the
run's files (nvidia-smi runs on a thread of its own, at most once per request, so a slow driver
never delays an answer after the first), at the lowest CPU priority, so watching a run never
slows it. Rates (CPU %, network, lines per minute) are over the time since the previous request;
the first request's over at least its ``window`` seconds, from a reading the run's supervisor
kept (remote/hostlib/counters.py) where one is that old, so `top --once` need not wait one out.
"""

import contextlib
import json
import os
import sys
import threading
import time

from clusterrun.remote.hostlib import counters, procs, pystack
from clusterrun.remote.probe import nvidia
from clusterrun.remote.shared import layout, nodestate, protocol, timing

PAGE = os.sysconf("SC_PAGE_SIZE")
TAIL = 4096  # bytes read from a log's end for its last line
LAST_LINE = 300  # characters of a last line shown
RATE_WINDOW = 60.0  # lines per minute over at most this many seconds
RESCAN = 2.0  # seconds between looks for rank processes not found yet

GPU_QUERY = ("index", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu",
             "power.draw", "clocks_throttle_reasons.active",
             "ecc.errors.uncorrected.volatile.total")
# Without the fields an old driver may not know.
GPU_BASIC = GPU_QUERY[:6]
# clocks_throttle_reasons.active is a bit mask (nvml.h, nvmlClocksThrottleReason*).
THROTTLE = ((0x2, "app_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
            (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"),
            (0x80, "hw_power_brake"), (0x100, "display_clocks"))


def memory():
    info = {}
    for line in (counters.read("/proc/meminfo") or b"").splitlines():
        key, _, rest = line.partition(b":")
        if rest.split():
            info[key.decode()] = int(rest.split()[0]) // 1024
    total = info.get("MemTotal")
    free = info.get("MemAvailable", info.get("MemFree"))
    return (total - free if total is not None and free is not None else None), total


def rss_mb(pid):
    statm = counters.read("/proc/%d/statm" % pid)
    return round(int(statm.split()[1]) * PAGE / 1048576.0, 1) if statm else None


def rank_cpu(rank, now, base, later=()):
    """A rank's CPU % between two readings: over the CPU time its process gained, or all it
    used where it started after ``base`` (a rank that came up within the window). Where
    ``base`` missed the process (not found yet), the first of ``later`` (readings after it,
    oldest first, each at least EVERY before ``now``) that has it: a shorter window, not none."""
    pid, start, ticks = now["pids"][rank]
    for each in (base, *later):
        before = each["pids"].get(rank)
        if before is not None and before[:2] == [pid, start]:
            spent, span = ticks - before[2], now["mono"] - each["mono"]
            break
    else:
        # The second test: a /proc/uptime of another clock (a container's) proves nothing.
        if not (counters.started_after(start, base)
                and start / float(counters.TICKS) <= (now["uptime"] or 0) + 1):
            return None
        spent, span = ticks, now["mono"] - base["mono"]
    return round(100.0 * spent / counters.TICKS / span, 1) if span > 0 else None


def last_line(path, size):
    """The log's last non-empty line (the last frame of a \\r progress bar)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, size - TAIL))
            data = handle.read(TAIL)
    except OSError:
        return None
    for line in reversed(data.split(b"\n")):
        parts = [p for p in line.split(b"\r") if p.strip()]
        if parts:
            return parts[-1].decode("utf-8", "replace").rstrip()[:LAST_LINE]
    return ""


def host_rates(now, base):
    """(CPU %, rx MB/s, tx MB/s) of the host between two readings."""
    cpu = rx = tx = None
    span = now["mono"] - base["mono"]
    if span > 0:
        busy, total = now["cpu"]
        if total > base["cpu"][1]:
            cpu = round(100.0 * (busy - base["cpu"][0]) / (total - base["cpu"][1]), 1)
        if now["net"] and base["net"]:
            rx = round((now["net"][0] - base["net"][0]) / span / 1e6, 3)
            tx = round((now["net"][1] - base["net"][1]) / span / 1e6, 3)
    return cpu, rx, tx


class LogRate:
    """Lines a log gained, counted from the offset where the previous look stopped."""

    def __init__(self, path):
        self.path = path
        self.offset = None
        self.lines = 0
        self.history = []  # (monotonic, lines so far)

    def seed(self, when, size):
        """Count from ``size`` bytes, as they stood at ``when`` (None: the log was not there
        yet, so all of it is new)."""
        self.offset, self.lines, self.history = size or 0, 0, [(when, 0)]

    def look(self, now):
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if self.offset is None or st.st_size < self.offset:
            self.offset = st.st_size  # count from the first look on, not the whole history
        elif st.st_size > self.offset:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                while True:
                    chunk = handle.read(1 << 20)
                    if not chunk:
                        break
                    self.lines += chunk.count(b"\n")
                    self.offset += len(chunk)
        self.history.append((now, self.lines))
        while len(self.history) > 2 and timing.due(now, self.history[1][0], RATE_WINDOW):
            self.history.pop(0)
        first_t, first_n = self.history[0]
        rate = (self.lines - first_n) * 60.0 / (now - first_t) if now > first_t else None
        return {"lines_per_min": None if rate is None else round(rate, 1),
                "last_line": last_line(self.path, st.st_size),
                "silent_s": round(max(0.0, time.time() - st.st_mtime), 1)}


class GpuPoll:
    """nvidia-smi on its own thread: a request starts a query when none is running, and every
    sample carries the latest answer."""

    def __init__(self, rundir=None):
        self.rundir = rundir  # where each answer is kept for the next sampler (None: nowhere)
        self.present = any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
                           for d in os.environ.get("PATH", "").split(os.pathsep) if d)
        self.latest = None
        self.error = None
        self.busy = False
        self.fields = list(GPU_QUERY)
        self.answered = threading.Event()  # set once the first query has ended

    def poke(self):
        if self.present and not self.busy:
            self.busy = True
            threading.Thread(target=self.query, daemon=True).start()

    def query(self):
        try:
            out, why = nvidia.nvidia_smi(["--query-gpu=" + ",".join(self.fields), nvidia.FORMAT])
            # A driver that refuses a field: ask without the newer ones from then on. One that
            # was only slow (a loaded host) is asked the whole query again next time.
            if out is None and not nvidia.no_answer(why) and len(self.fields) > len(GPU_BASIC):
                self.fields = list(GPU_BASIC)
                out, why = nvidia.nvidia_smi(["--query-gpu=" + ",".join(self.fields),
                                            nvidia.FORMAT])
            self.error = why
            if out is not None:
                self.latest = [self.parse(line) for line in out.splitlines() if line.strip()]
            if self.rundir is not None:
                counters.keep_gpus(self.rundir, self.latest, self.error)
        finally:
            self.busy = False
            self.answered.set()

    def parse(self, line):
        cells = dict(zip(self.fields, line.split(",")))
        mask = nvidia.value(cells.get("clocks_throttle_reasons.active", ""))
        try:
            bits = int(mask, 16) if mask else None
        except ValueError:
            bits = None
        power = nvidia.value(cells.get("power.draw", ""))
        try:
            watts = round(float(power.split()[0]), 1) if power else None
        except ValueError:
            watts = None
        return {"index": nvidia.number(cells.get("index", "")),
                "util_percent": nvidia.number(cells.get("utilization.gpu", "")),
                "mem_used_mb": nvidia.number(cells.get("memory.used", "")),
                "mem_total_mb": nvidia.number(cells.get("memory.total", "")),
                "temp_c": nvidia.number(cells.get("temperature.gpu", "")),
                "power_w": watts,
                "throttle": None if bits is None else [n for b, n in THROTTLE if bits & b],
                "ecc_errors": nvidia.number(cells.get("ecc.errors.uncorrected.volatile.total",
                                                      ""))}


class Sampler:
    def __init__(self, req):
        self.rundir = req["rundir"]
        self.interface = req.get("interface")
        self.ranks = list(range(req["ranks"][0], req["ranks"][1] + 1)) if req.get("ranks") else []
        self.logs = {r: LogRate(os.path.join(self.rundir, layout.rank_log(r)))
                     for r in self.ranks}
        self.began = time.monotonic()
        self.kept = counters.kept(self.rundir, self.interface)
        # The supervisor's newest reading names the ranks' processes: no walk of /proc for them.
        newest = self.kept[-1]["pids"] if self.kept else {}
        self.pids = {int(r): (p, s) for r, (p, s, _t) in newest.items()
                     if procs.start_time(p) == s and int(r) in self.logs}
        self.scanned = None  # when the ranks were last looked for (None: never)
        self.gpu = GpuPoll(self.rundir)
        self.gpu.poke()
        self.last = None  # the reading the next rates start at
        self.later = []  # the first answer's readings after self.last, for a rank it missed
        self.sample()  # this sampler's own: where no kept reading is old enough

    def open_window(self, window):
        """Before the first answer: its rates start at the newest reading at least ``window``
        seconds old, the supervisor's or this sampler's own; where none is that old, at the
        oldest, and the answer waits out the rest. GPUs, which are no rate: the answer a
        sampler kept at most ``window`` seconds ago (a `top` before this one), else this one's
        first, waited for at most as long as the window from its start."""
        now = time.monotonic()
        readings = [*self.kept, self.last]
        old = [r for r in readings if timing.due(now, r["mono"], window)]
        base = old[-1] if old else readings[0]
        if base is not self.last:
            for rank, log in self.logs.items():
                if base["logs"] is not None:
                    log.seed(base["mono"], base["logs"].get(str(rank)))
            self.later = [r for r in readings if r["mono"] > base["mono"]]
            self.last = base
        time.sleep(max(0.0, window - (now - base["mono"])))
        kept = counters.kept_gpus(self.rundir, window) if self.gpu.present else None
        if kept is not None and not self.gpu.answered.is_set():
            self.gpu.latest, self.gpu.error = kept
        elif self.gpu.present:
            self.gpu.answered.wait(max(0.0, self.began + window - time.monotonic()))

    def find_ranks(self, state, now):
        gone = [r for r, (pid, start) in self.pids.items() if procs.start_time(pid) != start]
        for rank in gone:
            del self.pids[rank]
        if len(self.pids) < len(self.ranks) and timing.due(now, self.scanned, RESCAN):
            self.scanned = now
            for rank, pid in pystack.find_ranks(self.rundir, procs.rank_roots(state)).items():
                if rank in self.logs:
                    self.pids[rank] = (pid, procs.start_time(pid))

    def sample(self):
        now = time.monotonic()
        state = procs.observed(nodestate.read(self.rundir))
        if state is not None and not state.ended:
            self.find_ranks(state, now)
        else:
            self.pids = {}
        base = self.last
        this = counters.reading(self.rundir, self.interface,
                                {r: pid for r, (pid, _start) in self.pids.items()})
        ranks = []
        for rank in self.ranks:
            found = str(rank) in this["pids"]
            entry = {"rank": rank, "pid": this["pids"][str(rank)][0] if found else None,
                     "cpu_percent": None, "rss_mb": None}
            if found:
                entry["rss_mb"] = rss_mb(entry["pid"])
                later = [r for r in self.later if this["mono"] - r["mono"] >= counters.EVERY]
                entry["cpu_percent"] = rank_cpu(str(rank), this, base, later) if base else None
            entry.update(self.logs[rank].look(this["mono"]) or
                         {"lines_per_min": None, "last_line": None, "silent_s": None})
            ranks.append(entry)
        cpu, rx, tx = host_rates(this, base) if base is not None else (None, None, None)
        span = this["mono"] - base["mono"] if base is not None else 0
        self.last, self.later = this, []
        self.gpu.poke()
        used, mem_total = memory()
        try:
            st = os.statvfs(self.rundir)
            disk_free = round(st.f_bavail * st.f_frsize / 1048576.0)
        except OSError:
            disk_free = None
        load = (counters.read("/proc/loadavg") or b"").split()[:3]
        host = {"cpu_percent": cpu, "net_rx_mbps": rx, "net_tx_mbps": tx, "mem_used_mb": used,
                "mem_total_mb": mem_total, "disk_free_mb": disk_free,
                "load": [float(x) for x in load] or None, "gpus": self.gpu.latest,
                "gpu_error": self.gpu.error, "interface_found": this["net"] is not None,
                "state": state.state if state is not None and state.state else "missing",
                "hostname": os.uname()[1], "time": time.time()}
        # ``window``: the seconds the rates are over (for tests and for people reading a reply).
        return {protocol.KIND: protocol.SAMPLE, "host": host, "ranks": ranks,
                "window": round(span, 3) if span > 0 else None}


def main(req):
    with contextlib.suppress(OSError):
        os.nice(19)  # the run's processes come first
    sampler = Sampler(req)
    out = sys.stdout.buffer
    opened = False
    for line in iter(sys.stdin.buffer.readline, b""):
        try:
            ask = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if not opened:
            opened = True
            sampler.open_window(float(ask.get("window") or 0))
        reply = sampler.sample()
        reply["seq"] = ask.get("seq")
        out.write(protocol.event_frame(reply))
        out.flush()


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
