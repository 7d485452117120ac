"""A warm launch's environments judged from preflight's own probe, with no status round trip.

Where every `environment:` host's absolute workdir is known (absolute in the inventory, or
remembered from an earlier status: workdirs.py), launch checks the hosts at once with each
environment's interpreter, and the probe reports the lock's environment with its facts
(remote/probe/envstate.py: the same platform and distributions as pyenv.py's status). A host whose
environment is the lock's is ready exactly as its status would have made it. Where any is not
(never built, drifted, its interpreter gone, the host unreachable or its probe failing),
preflight stops after the facts (``ready`` says no) and the sync runs for those hosts as it
does without this (``rest``: status, wheels, build, the same messages and exit statuses), then
preflight again.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional

from clusterrun.envs import platforms, wheels
from clusterrun.envs.hostenv import READY, EnvReport, HostEnv
from clusterrun.envs.hoststatus import HostStatus, Json
from clusterrun.envs.platforms import Platform, PlatformError
from clusterrun.envs.sync import Sync
from clusterrun.inventory import Inventory
from clusterrun.inventory.pylock import PythonEnv
from clusterrun.preflight.report import HostReport
from clusterrun.transport import programs
from clusterrun.transport.pool import Connections


class Warm:
    """``check(on_facts=warm.gate(...), after_facts=warm.ready)`` over ``inventory()``; where
    ``ready`` stopped preflight, ``rest()`` is the sync of the hosts left."""

    def __init__(self, sync: Sync, pool: Connections, workdirs: dict[str, str]) -> None:
        self.sync = sync
        self.pool = pool
        self.workdirs = workdirs  # host name -> its absolute workdir
        self._by_name = {h.spec.name: h for h in sync.hosts}
        self._wheels: dict[tuple[str, Platform], Optional[list[wheels.Wheel]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, inv: Inventory, pool: Connections, home: Path, *,
           say: Callable[[str], None]) -> Optional[Warm]:
        """None where a host's workdir is not known here yet: the sync asks its status first."""
        sync = Sync(inv, pool, home, say=say)
        known = {h.spec.name: sync.workdirs.get(h.spec) for h in sync.hosts}
        if not sync.hosts or any(w is None for w in known.values()):
            return None
        return cls(sync, pool, {name: w for name, w in known.items() if w is not None})

    def inventory(self, inv: Inventory) -> Inventory:
        """``inv`` with each `environment:` host's `python:` its environment's interpreter."""
        hosts = tuple(dataclasses.replace(h, python=self._python(self._by_name[h.name]))
                      if h.name in self._by_name else h for h in inv.hosts)
        return dataclasses.replace(inv, hosts=hosts)

    def _python(self, host: HostEnv) -> str:
        return f"{self.workdirs[host.spec.name]}/envs/{host.env.digest}/bin/python"

    def report(self) -> EnvReport:
        """The environments, every one ready once ``ready`` has let preflight go on."""
        return EnvReport(self.sync.hosts)

    def gate(self, on_facts: Optional[Callable[[HostReport], None]]
             ) -> Callable[[HostReport], None]:
        """Judges each host's environment as its facts come in; ``on_facts`` (the code's
        manifest read ahead) runs only where it is ready: nothing is asked of a host whose
        environment is to be rebuilt."""
        def seen(report: HostReport) -> None:
            if self.judge(report) and on_facts is not None:
                on_facts(report)

        return seen

    def judge(self, report: HostReport) -> bool:
        """Whether the host's facts show the lock's environment, made ready if so."""
        host = self._by_name.get(report.spec.name)
        if host is None:  # no `environment:` (or a spare): nothing to judge
            return True
        pyenv = report.facts.get("pyenv")
        if report.outcome is not None or not isinstance(pyenv, dict):
            return False
        # The status pyenv.py would have given, from the facts of the same interpreter.
        status: Json = dict(pyenv, python_path=report.facts.get("python_path"),
                            ssh_server_address=report.facts.get("ssh_server_address"))
        found = HostStatus.from_json(status)
        if found.workdir != self.workdirs[host.spec.name]:
            return False
        try:
            platform = platforms.from_status(host.spec.name, status)
        except PlatformError:  # said by the sync, as without this
            return False
        if platforms.python_refused(host.spec.name, status, host.env):  # the sync says why
            return False
        lock = self._cached(host.env, platform)
        if lock is None:
            return False
        expected = sorted(w.dist for w in lock if w.name != wheels.UV.name)
        if found.drift(expected):
            return False
        host.status, host.platform, host.wheels = status, platform, lock
        host.state, host.drift, host.in_env = READY, [], True
        return True

    def _cached(self, env: PythonEnv, platform: Platform) -> Optional[list[wheels.Wheel]]:
        key = (env.digest, platform)
        with self._lock:
            if key not in self._wheels:
                self._wheels[key] = wheels.cached(self.sync.cache, env, platform)
            return self._wheels[key]

    def ready(self, reports: Sequence[HostReport]) -> bool:
        """Whether every checked host's environment is the lock's, once their facts are in:
        preflight goes on past the facts only then."""
        names = {r.spec.name for r in reports}
        return all(h.state == READY for h in self.sync.hosts if h.spec.name in names)

    def rest(self, *, build: bool) -> EnvReport:
        """The sync of the hosts that were not ready (their status, the wheels, their build
        when ``build``); the ready ones keep their environment's interpreter parked for the
        next probe. What a stopped probe left parked on the others is ended first: an
        environment's interpreter must not build its replacement."""
        left = [h for h in self.sync.hosts if h.state != READY]
        programs.release(*(self.pool.get(h.spec) for h in left
                           if self.pool.connected(h.spec.name)))
        return self.sync.run(build=build, keep=True)
