"""A stall with no odd rank out: the data path between the run's hosts, tested again.

When every rank waits in the same collective, the stacks name no rank, and blaming the master
would throw the wrong host out on a restart. The likeliest cause left is a host whose data path
broke while its SSH stayed up (a NIC or switch port that flaps): Gloo and NCCL then wait on
peer sockets that carry nothing. So every host listens on an ephemeral port of the address its
ranks use and connects to every other host's (preflight's all-pairs test,
remote/tools/linkcheck.py), all at once, in seconds. For an attached run the controller runs the
test when the master's decider asks (stacks/stallview.py) and sends it what it found; the master
puts a failed pair on one host by `check`'s rule (remote/shared/linkrule.py: a host nobody
reaches, or one that reaches nobody), and that host is the stall's root cause. When every pair
connects, the report says the links are fine.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.preflight import mesh
from clusterrun.preflight.report import Blocked
from clusterrun.remote.shared import protocol
from clusterrun.runs import attempts
from clusterrun.runs import remote as remote_runs
from clusterrun.runs.records import PlanNode, PlanRecord
from clusterrun.runs.store import RunDir
from clusterrun.transport import SshOptions, Transport, parallel
from clusterrun.transport.programs import Interpreter, ProgramError, read_lines, start

PAIR_SECONDS = mesh.PAIR_SECONDS  # a connect that takes longer is a broken link, as in `check`
LISTEN_SECONDS = 20.0  # the program's start on a host (its interpreter, over SSH)


@dataclass
class Links:
    """The test's outcome: the hosts that took part, the pairs that failed, and the hosts that
    could not be tested (and why)."""

    hosts: list[str]
    blocked: list[Blocked]
    addresses: dict[str, str] = field(default_factory=dict)
    untested: dict[str, str] = field(default_factory=dict)


class _Host:
    """remote/tools/linkcheck.py running on one host: its answers, one JSON object a line."""

    def __init__(self, transport: Transport, spec: HostSpec, address: str) -> None:
        self.name = spec.name
        self.address = address
        self.port = 0
        self.answers: queue.Queue[Optional[dict[str, Any]]] = queue.Queue()
        self.interp: Interpreter = start(transport, spec, "linkcheck.py", {"addr": address},
                                         site=False)
        self._reader = threading.Thread(target=self._read, daemon=True, name="clusterrun-links")
        self._reader.start()

    def _read(self) -> None:
        for line in read_lines(self.interp.proc):
            if line.startswith(protocol.EVENT):
                with contextlib.suppress(ValueError):
                    self.answers.put(json.loads(line[len(protocol.EVENT):]))
        self.answers.put(None)

    def answer(self, key: str, timeout: float) -> Any:
        try:
            got = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise ProgramError(Outcome.PROBE_TIMEOUT,
                               f"{self.name}: no answer within {timeout:g} s") from None
        if got is None:
            err = self.interp.stderr.decode("utf-8", "replace").strip().splitlines()[-2:]
            raise ProgramError(Outcome.PROBE_FAILED, f"{self.name}: the link test ended early"
                               + (": " + " | ".join(err) if err else ""))
        if key not in got:
            raise ProgramError(Outcome.PROBE_FAILED, f"{self.name}: {got.get('error') or got}")
        return got[key]

    def close(self) -> None:
        """End it (EOF: its listener closes) and wait for it to exit: nothing left there."""
        proc = self.interp.proc
        with contextlib.suppress(OSError, EOFError):
            proc.close_stdin()
        with contextlib.suppress(OSError, EOFError):
            proc.wait(5)
        with contextlib.suppress(OSError, EOFError):
            proc.close()
        self._reader.join(5)  # its output has ended (EOF), or the channel is closed


def retest(run: RunDir, ssh: SshOptions, seconds: float = PAIR_SECONDS) -> Links:
    """Every host of the run's current attempt to every other, on the run's addresses."""
    attempt = attempts.current(run)
    addresses = {n.name: n.address or n.host for n in PlanRecord.of(attempt).nodes}
    out = Links([], [], addresses)
    if len(addresses) < 2:  # one host: its ranks talk over loopback, no link to test
        return out

    def listen(transport: Transport, spec: HostSpec, node: PlanNode) -> _Host:
        host = _Host(transport, spec, addresses[spec.name])
        try:
            host.port = int(host.answer("port", LISTEN_SECONDS))
        except BaseException:
            host.close()
            raise
        return host

    started = remote_runs.each_node(attempt, ssh, listen, ssh.connect_timeout + LISTEN_SECONDS)
    hosts: list[_Host] = []
    for result in started:
        if result.value is not None:
            hosts.append(result.value)
        else:
            out.untested[result.spec.name] = (result.failure.message if result.failure
                                              else "no answer")
    replies: dict[str, dict[str, Any]] = {}

    def connect(host: _Host) -> None:
        targets = [[o.name, o.address, o.port] for o in hosts if o is not host]
        host.interp.proc.write(json.dumps({"targets": targets, "timeout": seconds}).encode()
                               + b"\n")
        replies[host.name] = host.answer("pairs", seconds + 10)

    try:
        if len(hosts) > 1:
            done = parallel.run(connect, hosts, seconds + 15, fanout=len(hosts),
                                name=lambda h: h.name)
            for failed in done.failed:
                out.untested[failed.item.name] = (failed.failure.message if failed.failure
                                                  else "no answer")
    finally:
        for host in hosts:  # every listener stays open until every host has answered
            host.close()
    out.hosts = [h.name for h in hosts if h.name in replies]
    for source in out.hosts:
        for target, result in sorted(replies[source].items()):
            if not result.get("ok") and target in out.hosts:
                out.blocked.append(Blocked(source, target, str(result.get("error"))))
    return out

