"""What `clusterrun env` and `launch --dry-run` show of the hosts' environments."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional, TextIO

from clusterrun.envs import hostsite
from clusterrun.envs.hostenv import (
    BUILT,
    DRIFT,
    FAILED,
    MISSING,
    READY,
    EnvReport,
    HostEnv,
    describe_problem,
)
from clusterrun.inventory.ranges import fold

if TYPE_CHECKING:  # rich is loaded by Bars alone, on a terminal
    from rich.progress import TaskID


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def line(host: HostEnv) -> str:
    """One host in a line: its environment's path and what was found or done (and, with
    `system_site_packages`, which packages come from the lock and which from the host)."""
    head = f"{host.spec.name}: {host.path}"
    if host.state == READY:
        return f"{head}  ready (the lock's, nothing moved){_sources(host)}"
    if host.state == BUILT:
        moved = host.received + host.fetched
        took = f" in {host.seconds:g} s" if host.seconds is not None else ""
        return f"{head}  built{took} ({_mib(moved)} of wheels moved here){_sources(host)}"
    if host.state == MISSING:
        return f"{head}  not built yet"
    if host.state == DRIFT and not host.built_here:  # built and still not: its paragraph
        return f"{head}  differs from the lock: " + "; ".join(host.drift)
    return "; ".join(describe_problem(host))


def _sources(host: HostEnv) -> str:
    said = hostsite.summary(host)
    return f"; {said}" if said else ""


def render_plain(report: EnvReport, out: TextIO, err: Optional[TextIO] = None) -> None:
    """A line per host on ``out``; a host that could not get its environment (no wheel for
    its platform, unreachable, a full disk) says why on ``err`` when given."""
    said: set[str] = set()
    for host in report.hosts:
        text = line(host)
        if text in said:  # a platform's problem names all its hosts: said once
            continue
        said.add(text)
        failed = host.state == FAILED or (host.state == DRIFT and host.built_here)
        (err if err is not None and failed else out).write(text + "\n")
    if report.sent:
        out.write(f"sent {_mib(report.sent)} of wheels over this machine's link (once)\n")


def what_to_do(report: EnvReport, inventory_path: str) -> Optional[str]:
    """The fix where hosts lack the lock's environment or theirs differs from it (`check` and
    `env --check` change nothing): `clusterrun env`, which builds or rebuilds only those."""
    missing = [h.spec.name for h in report.hosts if h.state == MISSING]
    drifted = [h.spec.name for h in report.hosts if h.state == DRIFT and not h.built_here]
    if not missing and not drifted:
        return None
    found = " ".join(
        part for part in (f"The lock's environment is not built yet on {fold(missing)}."
                          if missing else "",
                          f"The environment on {fold(drifted)} differs from the lock."
                          if drifted else "")
        if part)
    return (f"clusterrun: {found} `clusterrun env {inventory_path}` builds it there from the "
            "lock (`launch` does too, before it starts the ranks); "
            "`check` then checks the hosts with that environment's interpreter.")


def as_json(report: EnvReport) -> dict[str, object]:
    """`env --json`'s object, and `check --json`'s ``environment`` (docs/commands.md)."""
    return {"ok": report.ok, "sent_bytes": report.sent,
            "hosts": [h.as_json() for h in report.hosts]}


def render_json(report: EnvReport, out: TextIO) -> None:
    out.write(json.dumps(as_json(report)) + "\n")


def check_json(report: EnvReport, out: TextIO) -> None:
    """`check --json` when a host's environment is not the lock's: check's own object, each
    host failing (or passing) its `environment` check and nothing else run (no node rank is
    given yet), and the environments as `env --json` gives them."""
    hosts = []
    for host in report.hosts:
        detail = line(host) if not host.ok else f"{host.path} is the lock's"
        hosts.append({"host": host.spec.host, "name": host.spec.name, "node_rank": None,
                      "ok": host.ok, "interface": None, "address": None, "python": None,
                      "torch": None, "gpus": 0,
                      "checks": [{"name": "environment", "ok": host.ok, "warning": False,
                                  "detail": detail}]})
    json.dump({"ok": False, "master_addr": None, "master_port": None, "hosts": hosts,
               "pairs": None, "environment": as_json(report)}, out, indent=2)
    out.write("\n")


class Bars:
    """`clusterrun env` on a terminal: a progress bar per host on stderr while wheels move and
    builds run (rich, loaded only here), cleared when done; ``say`` prints above them."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.bars = Progress(TextColumn("{task.fields[host]}"), BarColumn(),
                             TextColumn("{task.description}"),
                             console=Console(stderr=True), transient=True)
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> Bars:
        self.bars.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.bars.stop()

    def say(self, text: str) -> None:
        self.bars.console.print(f"clusterrun: {text}", highlight=False, markup=False)

    def update(self, host: HostEnv, text: str, done: float) -> None:
        name = host.spec.name
        if name not in self.tasks:
            self.tasks[name] = self.bars.add_task(text, total=1.0, host=name)
        self.bars.update(self.tasks[name], description=text, completed=done)
