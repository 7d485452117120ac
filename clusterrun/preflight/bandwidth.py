"""`check --bandwidth`: TCP throughput from every worker to the master on its chosen interface.

The master's probe opens a sink on master_addr; each worker's probe then sends to it from its
chosen interface's address for about a second (SECONDS, or MAX_BYTES on a link fast enough to send
them sooner) -- clusterrun/remote/probe/throughput.py. Workers go one at a time: measured together
they would share the master's ingress, and every one of them would see a fraction of the link and be
warned for nothing. So the phase takes about a second per worker, and never longer than
``budget()``: a worker left when it runs out is reported as not measured.

One TCP stream from a Python process is a lower bound of what the link carries, which is the
right side to err on for the question asked: is this network slow enough that multi-node training
may lose to one node? Below WARN_GBIT it warns (a warning, not a failure: the job would run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional

from clusterrun.errors import ClusterrunError
from clusterrun.preflight.answers import Blast, Listening
from clusterrun.preflight.probe_session import ProbeSession
from clusterrun.preflight.report import HostReport
from clusterrun.remote.shared.protocol import Probe

WARN_GBIT = 10.0
SECONDS = 1.0
MAX_BYTES = 2 << 30  # 2 GiB: 17 Gbit/s for a whole second, well above WARN_GBIT
WAIT_SECONDS = 5.0  # each connect, stalled send, or wait for the count on the master
CHECK = "bandwidth"


def budget(workers: int) -> float:
    """The most the phase may take: a second and a little per worker, plus room for a few
    workers that each cost a connect timeout."""
    return 2 * WAIT_SECONDS + workers * (SECONDS + 1.0)


def measure(reports: Sequence[HostReport], sessions: dict[str, ProbeSession],
            master_addr: str) -> None:
    """Add a ``bandwidth`` check to every worker (``reports[1:]``) that could be measured or
    should have been; hosts that failed earlier keep only the reasons they already have."""
    master = reports[0]
    workers = [r for r in reports[1:] if r.outcome is None and r.spec.name in sessions]
    if not workers:
        return
    port, problem = _open_sink(sessions.get(master.spec.name), master_addr)
    deadline = time.monotonic() + budget(len(workers))
    for report in workers:
        reason = problem or _unmeasurable(report, deadline, len(workers))
        if reason:
            report.add(CHECK, True, f"warning: not measured: {reason}")
            continue
        assert port is not None
        try:
            reply = sessions[report.spec.name].ask(
                Probe.BLAST, addr=master_addr, port=port, src=report.address, seconds=SECONDS,
                bytes=MAX_BYTES, timeout=WAIT_SECONDS)
        except ClusterrunError as exc:  # the worker's probe died or went silent
            report.add(CHECK, False, f"{_pair(report, master, master_addr)}: {exc.message}")
            continue
        judge(report, Blast.from_json(reply), master, master_addr, port)


def _open_sink(session: Optional[ProbeSession], addr: str) -> tuple[Optional[int], str]:
    if session is None:
        return None, "the master could not be probed"
    try:
        reply = Listening.from_json(session.ask(Probe.SINK, addr=addr, timeout=WAIT_SECONDS))
    except ClusterrunError as exc:
        return None, f"the master's probe failed: {exc.message}"
    if not reply.ok or reply.port is None:
        return None, f"no port could be opened on the master at {addr}: {reply.error}"
    return reply.port, ""


def _unmeasurable(report: HostReport, deadline: float, workers: int) -> str:
    if report.address is None:
        return "no interface was chosen"
    if any(c.name == "data_path" and not c.ok for c in report.checks):
        return "no data path to the master"
    if time.monotonic() + SECONDS > deadline:
        return (f"the measurement's {budget(workers):.0f} s were spent before this host's turn "
                "(hosts before it timed out)")
    return ""


def _pair(report: HostReport, master: HostReport, master_addr: str) -> str:
    return (f"{report.spec.name} ({report.address}) -> {master.spec.name} ({master_addr})")


def judge(report: HostReport, reply: Blast, master: HostReport, master_addr: str,
          port: int) -> None:
    """The ``blast`` reply of one worker as its check and its ``bandwidth`` fact."""
    if not reply.ok:
        stage = reply.stage
        what = {"connect": f"cannot connect to port {port}",
                "send": "the transfer stalled",
                "answer": "the master did not confirm what it received"}.get(
                    str(stage), "the measurement failed")
        report.add(CHECK, False, f"{_pair(report, master, master_addr)}: {what}: "
                   f"{reply.error}. NCCL and Gloo connect between hosts on ports like "
                   "this one; a firewall between them would hang the job at its first "
                   "collective.")
        return
    nbytes, seconds = reply.bytes, reply.seconds
    gbit = gbit_per_s(nbytes, seconds)
    report.facts["bandwidth"] = {"gbit_s": round(gbit, 3), "bytes": nbytes,
                                 "seconds": round(seconds, 3)}
    detail = (f"{gbit:.2f} Gbit/s to {master.spec.name} ({master_addr}) from "
              f"{report.interface} in {seconds:.1f} s")
    if gbit < WARN_GBIT:
        detail = (f"warning: {detail}, below {WARN_GBIT:g} Gbit/s: multi-node training over "
                  "this link may be slower than on one node")
    report.add(CHECK, True, detail)


def gbit_per_s(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else 0.0
