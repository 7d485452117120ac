"""Every host's `environment:` made the lock's, or found to differ.

1. status (one round trip): each host's platform and its environment as built there. A host
   whose environment is the lock's (the wheels' exact name==version, the same interpreter) is
   done: a cache hit moves nothing and builds nothing.
2. wheels: for each platform of the hosts left, the lock's wheels from the controller's cache
   (pip fills it), and which of them each host's store lacks.
3. shipped once: the controller sends the master what any host lacks; the master serves its
   store on its data address (wheelserve.py: a fresh port, a random token, for this sync only)
   and the other hosts fetch from it over the cluster's own network.
4. built: uv on each host, offline, from its store; then each reports its environment again,
   which must be the lock's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Callable, Optional

from clusterrun.envs import hostsite, platforms, serve, wheels
from clusterrun.envs.hostenv import (  # the hosts' states and report, named here for callers
    BUILT,
    DRIFT,
    FAILED,
    MISSING,
    READY,
    EnvReport,
    HostEnv,
    describe_problem,
)
from clusterrun.envs.hoststatus import Json
from clusterrun.envs.platforms import Platform
from clusterrun.envs.verify import differences
from clusterrun.envs.wheels import Wheel
from clusterrun.envs.workdirs import Workdirs
from clusterrun.errors import ClusterrunError, Outcome
from clusterrun.inventory import AUTO, Inventory
from clusterrun.jsonfields import integer, number, strings, text
from clusterrun.remote.shared.protocol import OP, Env
from clusterrun.transport import parallel, programs
from clusterrun.transport.pool import Connections

__all__ = ["BUILT", "DRIFT", "FAILED", "MISSING", "READY", "EnvReport", "HostEnv", "Sync",
           "describe_problem", "differences", "sync"]

STATUS_SECONDS = 30.0
MOVE_SECONDS = 1800.0  # wheels of a CUDA torch are GBs; a slow link takes its time
BUILD_SECONDS = 1800.0

# What a host is doing, and how far along (0 to 1), as the sync goes: `clusterrun env`'s bars.
Progress = Callable[[HostEnv, str, float], None]


class Sync:
    """One sync of the inventory's `environment:` hosts over ``pool``."""

    def __init__(self, inv: Inventory, pool: Connections, home: Path, *,
                 say: Callable[[str], None] = lambda _text: None,
                 progress: Optional[Progress] = None) -> None:
        self.inv = inv
        self.pool = pool
        self.cache = wheels.Cache(home / "wheels")
        self.say = say
        self.progress: Progress = progress or (lambda _host, _text, _done: None)
        self.workdirs = Workdirs(home / "wheels" / "hosts")
        self.hosts = [HostEnv(h) for h in inv.hosts if h.environment is not None]

    def _call(self, host: HostEnv, request: Mapping[str, object], timeout: float,
              payload: Iterable[bytes] = (), python: Optional[str] = None) -> Json:
        """pyenv.py's reply to ``request`` (remote/shared/protocol.py's ``Env``); a refusal
        raises, with the host's words (and the folder, where its disk is full)."""
        spec = host.spec
        asked = {"workdir": spec.workdir, "lock": host.env.digest, **request}
        run_as = dataclasses.replace(spec, python=python) if python else spec
        reply: Json = programs.call(self.pool.get(spec), run_as, "pyenv.py", asked, timeout,
                                    payload=payload, site=False)
        if reply.get("error"):
            host.disk_full = text(reply.get("disk_full"))
            raise ClusterrunError(f"{spec.name}: {reply['error']}")
        return reply

    def _each(self, fn: Callable[[HostEnv], None], hosts: Sequence[HostEnv],
              deadline: float) -> None:
        """``fn`` on every host at once; a host that fails keeps its reason."""
        result = parallel.run(fn, list(hosts), deadline, name=lambda h: h.spec.name)
        for item in result.failed:
            item.item.state = FAILED
            item.item.unreachable = bool(item.failure and not item.failure.outcome.reached)
            item.item.problem = item.item.problem or (item.failure.message if item.failure
                                                      else None)

    # 1. status
    def _status(self, host: HostEnv) -> Json:
        """The host's status, asked of the lock's environment's own interpreter where the host
        built it before (its absolute workdir remembered here): a warm launch's probe then
        takes that interpreter's channel, and no base interpreter has to be ended first. Where
        that interpreter is not there (never built, removed), its base interpreter answers."""
        workdir = self.workdirs.get(host.spec)
        asked = {OP: Env.STATUS, **hostsite.asked(host)}
        if workdir is not None:
            try:
                reply = self._call(host, asked, STATUS_SECONDS,
                                   python=f"{workdir}/envs/{host.env.digest}/bin/python")
                host.in_env = True
                return reply
            except programs.ProgramError as exc:
                if exc.outcome is not Outcome.PROBE_FAILED:  # a host that hangs: said once
                    raise
        reply = self._call(host, asked, STATUS_SECONDS)
        self.workdirs.remember(host.spec, str(reply.get("workdir") or ""))
        return reply

    def status(self) -> None:
        """Each host's status, but for the hosts whose status preflight's probe gave already
        (envs/warm.py)."""
        def one(host: HostEnv) -> None:
            host.status = self._status(host)
            host.platform = platforms.from_status(host.spec.name, host.status)
            self.progress(host, "gathering wheels", 0.1)

        self._each(one, [h for h in self.hosts if not h.status], STATUS_SECONDS + 30)

    # 2. wheels
    def resolve(self) -> None:
        groups: dict[tuple[str, Platform], list[HostEnv]] = {}
        for host in self.hosts:
            refused = platforms.python_refused(host.spec.name, host.status, host.env) \
                if host.platform is not None else None
            if refused:  # nothing of this lock can be built on it
                host.state, host.problem = FAILED, refused
                continue
            if host.platform is not None and host.problem is None:
                groups.setdefault((host.env.lock, host.platform), []).append(host)
        for (_lock, platform), members in sorted(groups.items(), key=lambda g: g[0][1]):
            try:
                found = wheels.resolve(self.cache, members[0].env, platform,
                                       [m.spec.name for m in members])
            except ClusterrunError as exc:  # no wheel for this platform: these hosts say so
                for host in members:
                    host.state, host.problem = FAILED, exc.message
                continue
            for host in members:
                host.wheels = found
                host.problem = hostsite.refusal(host)  # a host's own package pinned otherwise
                drift = host.found.drift(host.expected())
                host.drift = [] if drift == ["not built"] else drift
                host.state = FAILED if host.problem else READY if not drift else (
                    MISSING if drift == ["not built"] else DRIFT)
        self._say_skipped(groups)

    def _say_skipped(self, groups: dict[tuple[str, Platform], list[HostEnv]]) -> None:
        """Once: a requirements lock's line whose marker holds on none of the hosts (as pip
        skips it there). uv.lock's markers are clusterrun's own reading of the lock: not said."""
        envs = {h.env.lock: h.env for hosts in groups.values() for h in hosts}
        for lock, env in envs.items():
            if lock.endswith("uv.lock"):
                continue
            seen = [platform.markers() for (used, platform) in groups if used == lock]
            for pin in env.pins:
                if pin.marker and not any(pin.applies(values) for values in seen):
                    self.say(f"{lock}, line {pin.line}: {pin.shown} is for none of the hosts; "
                             "skipped")

    def run(self, *, build: bool, keep: bool = False) -> EnvReport:
        """Status and wheels; with ``build``, every host not ready made so. The base
        interpreters this left parked on the connections are ended: the command's next program
        on a host (preflight's probe) must start in the environment's interpreter, not in one
        of them. ``keep``: a ready host's environment interpreter stays parked, for it."""
        try:
            return self._run(build=build)
        finally:
            self._release([h for h in self.hosts if not (keep and h.in_env and h.ok)])

    def _release(self, hosts: Sequence[HostEnv]) -> None:
        programs.release(*(self.pool.get(h.spec) for h in hosts
                           if self.pool.connected(h.spec.name)))

    def _run(self, *, build: bool) -> EnvReport:
        self.status()
        self.resolve()
        # An environment's own interpreter must not build its replacement: what is built or
        # fetched next runs in the base interpreter.
        self._release([h for h in self.hosts if h.in_env and not h.ok])
        report = EnvReport(self.hosts)
        todo = [h for h in self.hosts if h.state in (MISSING, DRIFT)]
        for host in self.hosts:
            if host not in todo or not build:
                self.progress(host, host.state.value, 1.0)
        if build and todo:
            self.say(f"environment {todo[0].env.digest}: building on "
                     f"{len(todo)} of {len(self.hosts)} host(s)")
            report.sent = self._ship(todo)
            self._build([h for h in todo if h.problem is None])
            for host in todo:
                self.progress(host, host.state.value, 1.0)
        return report

    def prune(self) -> None:
        """Every environment but the lock's and the most recently used other one, removed."""
        def one(host: HostEnv) -> None:
            reply = self._call(host, {OP: Env.PRUNE, "keep": [host.env.digest]}, STATUS_SECONDS)
            removed = strings(reply.get("removed"))
            if removed:
                self.say(f"{host.spec.name}: removed {', '.join(removed)}")

        self._each(one, [h for h in self.hosts if h.ok], STATUS_SECONDS + 30)

    # 3. shipped once
    def _relay(self) -> HostEnv:
        master = self.inv.master.name
        return next((h for h in self.hosts if h.spec.name == master), self.hosts[0])

    def _ship(self, todo: list[HostEnv]) -> int:
        relay = self._relay()
        everyone = todo if relay in todo else [relay, *todo]

        def have(host: HostEnv) -> None:
            want = todo_wheels if host is relay else host.wheels
            request: Json = {OP: Env.STATUS, "want": [w.item for w in want]}
            if host is relay and relay.spec.interface != AUTO:  # where it serves the others
                request["interface"] = relay.spec.interface
            reply = self._call(host, request, STATUS_SECONDS)
            host.missing = list(strings(reply.get("missing")))
            if host is relay:
                host.status = {**host.status, "interface_address": reply.get("interface_address")}

        todo_wheels = list({w.sha: w for h in todo for w in h.wheels}.values())
        self._each(have, everyone, STATUS_SECONDS + 30)
        if relay.problem:
            for host in todo:
                host.state, host.problem = FAILED, host.problem or relay.problem
            return 0
        workers = [h for h in todo if h is not relay and h.missing and h.problem is None]
        needed = {sha for h in [relay, *workers] for sha in h.missing}
        send = [w for w in todo_wheels if w.sha in needed and w.sha in relay.missing]
        sent = self._send(relay, send) if send else 0
        if relay.state == FAILED:  # what it could not take, the others cannot fetch
            for host in workers:
                host.state, host.problem = FAILED, host.problem or relay.problem
        elif workers:
            with self._serving(relay) as url:
                self._each(lambda h: self._fetch(h, url), workers, MOVE_SECONDS)
        return sent

    def _send(self, relay: HostEnv, send: list[Wheel]) -> int:
        total = sum(w.size for w in send)
        self.say(f"sending {len(send)} wheel(s), {total / 2**20:.1f} MiB, to "
                 f"{relay.spec.name} (once, for every host)")

        def blocks() -> Iterator[bytes]:
            done = 0
            for wheel in send:
                with self.cache.path(wheel).open("rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        yield block
                        done += len(block)
                        self.progress(relay, f"receiving {done / 2**20:.0f}/"
                                      f"{total / 2**20:.0f} MiB", 0.1 + 0.5 * done / total)

        def one(host: HostEnv) -> None:
            self._call(host, {OP: Env.RECEIVE, "files": [w.item for w in send]}, MOVE_SECONDS,
                       payload=blocks())
            host.received = total

        self._each(one, [relay], MOVE_SECONDS + 30)
        return total if relay.problem is None else 0

    @contextlib.contextmanager
    def _serving(self, relay: HostEnv) -> Iterator[str]:
        bind = serve.address(self.inv, relay.spec, relay.status)
        with serve.serving(self.pool.get(relay.spec), relay.spec, bind,
                           STATUS_SECONDS) as (url, token):
            self._token = token
            yield url

    def _fetch(self, host: HostEnv, url: str) -> None:
        files = [w.item for w in host.wheels if w.sha in host.missing]
        self.progress(host, f"fetching {len(files)} wheel(s) from the master", 0.3)
        reply = self._call(host, {OP: Env.FETCH, "url": url, "token": self._token,
                                  "files": files}, MOVE_SECONDS)
        host.fetched = integer(reply.get("fetched")) or 0

    # 4. built
    def _build(self, hosts: list[HostEnv]) -> None:
        def one(host: HostEnv) -> None:
            uv = next(w for w in host.wheels if w.name == wheels.UV.name)
            lock = [w for w in host.wheels if w.name != wheels.UV.name]
            started = time.monotonic()
            self.progress(host, "building", 0.65)
            reply = self._call(host, {
                # The wheels gathered for its platform, each checked against the lock here:
                # its markers are evaluated, its direct references are files in the store.
                OP: Env.BUILD, "requirements": "".join(f"{w.dist}\n" for w in lock),
                "files": [w.item for w in lock], "uv": uv.item,
                "expected": host.expected(), "python": host.found.python,
                "system_site_packages": host.env.system_site_packages}, BUILD_SECONDS)
            host.status = {**host.status, "env": reply.get("env")}
            host.drift = host.found.drift(host.expected())
            host.state, host.built_here = (DRIFT if host.drift else BUILT), True
            took = number(reply.get("seconds"))
            host.seconds = (round(time.monotonic() - started, 2) if took is None else took) \
                if reply.get("built") else None

        self._each(one, hosts, BUILD_SECONDS + 60)


def sync(inv: Inventory, pool: Connections, home: Path, *, build: bool = True,
         say: Callable[[str], None] = lambda _text: None) -> EnvReport:
    """Every `environment:` host made the lock's (``build``), or only looked at; a ready
    host's environment interpreter is left parked for the command's next program there."""
    return Sync(inv, pool, home, say=say).run(build=build, keep=True)
