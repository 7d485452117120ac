"""`clusterrun top`'s sampler on one host of a run (stdlib only, Python 3.6+).

Started once per host and kept for as long as `top` watches: every line on stdin asks for one
sample, answered with one ``J <json>`` line; EOF ends it. It only reads /proc, /sys and the
run's files (nvidia-smi runs on a thread of its own, at most once per request, so a slow driver
never delays an answer), at the lowest CPU priority, so watching a run never slows it. Rates
(CPU %, network, lines per minute) are over the time since the previous request.
"""

import contextlib
import json
import os
import sys
import threading
import time

from clusterrun.remote.hostlib import procs, pystack
from clusterrun.remote.probe import nvidia
from clusterrun.remote.shared import layout, nodestate, protocol, timing

TICKS = os.sysconf("SC_CLK_TCK")
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


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def cpu_times():
    """(busy, total) jiffies of the whole host, from /proc/stat's first line."""
    fields = [int(x) for x in (read("/proc/stat") or b"cpu 0 0 0 0").split(b"\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def memory():
    info = {}
    for line in (read("/proc/meminfo") or b"").splitlines():
        key, _, rest = line.partition(b":")
        if rest.split():
            info[key.decode()] = int(rest.split()[0]) // 1024
    total = info.get("MemTotal")
    free = info.get("MemAvailable", info.get("MemFree"))
    return (total - free if total is not None and free is not None else None), total


def net_bytes(interface):
    """(rx, tx) bytes of one interface, from this network namespace's /proc/net/dev."""
    for line in (read("/proc/net/dev") or b"").decode("ascii", "replace").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == interface:
            words = rest.split()
            return int(words[0]), int(words[8])
    return None


def proc_cpu_rss(pid):
    """(cpu jiffies, rss MB) of one process, or None when it is gone."""
    stat = read("/proc/%d/stat" % pid)
    statm = read("/proc/%d/statm" % pid)
    if not stat or not statm:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(statm.split()[1]) * PAGE / 1048576.0


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


class LogRate:
    """Lines a log gained, counted from the offset where the previous look stopped."""

    def __init__(self, path):
        self.path = path
        self.offset = None
        self.lines = 0
        self.history = []  # (monotonic, lines so far)

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

    def __init__(self):
        self.present = any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
                           for d in os.environ.get("PATH", "").split(os.pathsep) if d)
        self.latest = None
        self.error = None
        self.busy = False
        self.fields = list(GPU_QUERY)

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
        finally:
            self.busy = False

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
        self.pids = {}  # rank -> (pid, start time)
        self.scanned = None  # when the ranks were last looked for (None: never)
        self.gpu = GpuPoll()
        self.gpu.poke()
        self.last = None  # (monotonic, host busy, host total, net, {pid: jiffies})
        self.sample()  # the baseline the first request's rates are measured from

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
        busy, total = cpu_times()
        net = net_bytes(self.interface) if self.interface else None
        jiffies = {}
        ranks = []
        for rank in self.ranks:
            pid = self.pids.get(rank, (None, None))[0]
            usage = proc_cpu_rss(pid) if pid else None
            entry = {"rank": rank, "pid": pid if usage else None, "cpu_percent": None,
                     "rss_mb": None}
            if usage:
                jiffies[pid] = usage[0]
                entry["rss_mb"] = round(usage[1], 1)
                if self.last and pid in self.last[4] and now > self.last[0]:
                    spent = (usage[0] - self.last[4][pid]) / float(TICKS)
                    entry["cpu_percent"] = round(100.0 * spent / (now - self.last[0]), 1)
            entry.update(self.logs[rank].look(now) or
                         {"lines_per_min": None, "last_line": None, "silent_s": None})
            ranks.append(entry)
        cpu = rx = tx = None
        if self.last is not None and now > self.last[0]:
            dt = now - self.last[0]
            if total > self.last[2]:
                cpu = round(100.0 * (busy - self.last[1]) / (total - self.last[2]), 1)
            if net and self.last[3]:
                rx = round((net[0] - self.last[3][0]) / dt / 1e6, 3)
                tx = round((net[1] - self.last[3][1]) / dt / 1e6, 3)
        self.last = (now, busy, total, net, jiffies)
        self.gpu.poke()
        used, mem_total = memory()
        try:
            st = os.statvfs(self.rundir)
            disk_free = round(st.f_bavail * st.f_frsize / 1048576.0)
        except OSError:
            disk_free = None
        load = (read("/proc/loadavg") or b"").split()[:3]
        host = {"cpu_percent": cpu, "net_rx_mbps": rx, "net_tx_mbps": tx, "mem_used_mb": used,
                "mem_total_mb": mem_total, "disk_free_mb": disk_free,
                "load": [float(x) for x in load] or None, "gpus": self.gpu.latest,
                "gpu_error": self.gpu.error, "interface_found": net is not None,
                "state": state.state if state is not None and state.state else "missing",
                "hostname": os.uname()[1], "time": time.time()}
        return {protocol.KIND: protocol.SAMPLE, "host": host, "ranks": ranks}


def main(req):
    with contextlib.suppress(OSError):
        os.nice(19)  # the run's processes come first
    sampler = Sampler(req)
    out = sys.stdout.buffer
    for line in iter(sys.stdin.buffer.readline, b""):
        try:
            ask = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        reply = sampler.sample()
        reply["seq"] = ask.get("seq")
        out.write(protocol.event_frame(reply))
        out.flush()


if __name__ == "__main__":
    main(json.loads(sys.stdin.buffer.readline()))
