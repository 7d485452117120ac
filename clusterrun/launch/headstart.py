"""The code's manifest on each host, read while preflight is still running.

As soon as preflight has a host's facts (its workdir), launch asks that host for the SHA-256
of every file of the script's directory, while the other hosts' probes and the cluster-wide
checks (master, data paths, the all-pairs mesh) go on. The sync after preflight starts from
those answers: when nothing changed, nothing is left to do. Reading is all it does: nothing is
written to a host before preflight has passed, and a host it could not read is simply synced
from the start, as without it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from clusterrun.launch import sync
from clusterrun.plan import build as planning
from clusterrun.plan.model import Job
from clusterrun.preflight.report import HostReport
from clusterrun.transport.pool import Connections

Manifest = dict[str, tuple[int, str]]


class HeadStart:
    """``preflight.run(..., on_facts=head.read)``, then ``sync.sync(..., early=head.answers)``."""

    def __init__(self, job: Job, pool: Connections, excludes: Sequence[str]) -> None:
        self.job = job
        self.pool = pool
        self.src: Path = job.code.resolve()
        self.patterns = sync.patterns(self.src, excludes)
        self._local: Optional[Manifest] = None
        self._hashing = threading.Lock()  # apart: a big tree must not hold up read()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._found: dict[str, tuple[str, Manifest]] = {}

    def local(self) -> Manifest:
        """This machine's manifest, hashed once for every host (and for the sync after)."""
        with self._hashing:
            if self._local is None:
                self._local = sync.manifest(self.src, self.patterns)
            return self._local

    def read(self, report: HostReport) -> None:
        spec = report.spec
        # SSH hosts only: a container or a Slurm step gets its manifest after preflight.
        if spec.local or spec.own_files or spec.container or spec.transport != "ssh":
            return
        cwd, code_dest = planning.code_paths(spec, report.workdir or spec.workdir, self.job,
                                             True)
        dest = code_dest or cwd
        thread = threading.Thread(target=self._read, args=(report, dest), daemon=True,
                                  name=f"clusterrun-headstart-{spec.name}")
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _read(self, report: HostReport, dest: str) -> None:
        # Preflight's connection, or none: a host it has since left out is not reconnected.
        transport = self.pool.transports.get(report.spec.name)
        if transport is None:
            return
        try:
            files = sorted(self.local())
            found = sync.remote_manifest(transport, report.spec, dest, files)
        except Exception:  # the sync after preflight asks again, and reports what went wrong
            return  # (also when preflight failed and its connections are closed under us)
        with self._lock:
            self._found[report.spec.name] = (dest, found)

    def answers(self, timeout: float = sync.SYNC_SECONDS) -> sync.Early:
        """This machine's manifest and every answering host's, after waiting up to ``timeout``
        s for the reads still under way."""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)
        local = self.local()
        with self._lock:
            return sync.Early(self.src, self.patterns, local, dict(self._found))
