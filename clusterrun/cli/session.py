"""`clusterrun session`: the warm session's daemon, what it holds, and ending it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import click

from clusterrun.cli.common import CONTEXT
from clusterrun.remote.shared import frames
from clusterrun.session import client, paths


@click.group(context_settings=CONTEXT, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.pass_context
def session(ctx: click.Context, as_json: bool) -> None:
    """The warm session: the per-user daemon that keeps one connection and one agent per host
    across commands (off with CLUSTERRUN_SESSION=0). Shows its pid, since when it runs, how long
    it has been idle, and the hosts it holds with their agent's pid."""
    if ctx.invoked_subcommand is not None:
        return
    status = client.ask(frames.STATUS)
    older = _older()
    if as_json:
        click.echo(json.dumps({"running": status is not None, **(status or {}),
                               "other_daemons": [o["pid"] for o in older]}))
        return
    for other in older:
        click.echo(f"a daemon of other clusterrun code, or of a shell with another HOME or "
                   f"ssh-agent, also runs (pid {other['pid']}); `clusterrun session stop` "
                   "ends it")
    if status is None:
        click.echo("no session running" + ("" if paths.enabled() else
                                           " (off: CLUSTERRUN_SESSION=0 is set)"))
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["since"]))
    click.echo(f"session daemon pid {status['pid']}, since {since}, idle {status['idle']:g} s "
               f"(exits after {status['idle_limit']:g} s)")
    hosts = status.get("hosts") or []
    # Hosts it connects now: a command's first word, or those a command that found no daemon
    # reached directly and handed over (they are held a moment later).
    connecting = status.get("connecting") or []
    width = max([len(h["name"]) for h in hosts] + [len(n) for n in connecting] + [4])
    for host in hosts:
        state = f"agent pid {host['agent_pid']}" if host["alive"] else "connection lost"
        click.echo(f"  {host['name']:<{width}}  {host['address']:<15}  {state}")
    for name in connecting:
        click.echo(f"  {name:<{width}}  {'':<15}  connecting")
    if not hosts and not connecting:
        click.echo("  no hosts held")


@session.command(context_settings=CONTEXT)
def stop() -> None:
    """End the session now: its agents exit (EOF on their channel), connections close. A
    daemon left by other clusterrun code (before an upgrade), or started from a shell with
    another HOME or ssh-agent, is ended too."""
    ended = [pid for pid in map(_stop_one, paths.sockets()) if pid is not None]
    if not ended:
        click.echo("no session running")
        return
    click.echo(f"session stopped (daemon pid {', '.join(map(str, ended))})")


def _older() -> list[dict[str, Any]]:
    """The daemons of other clusterrun code, or of another environment (paths.stamp), still
    listening in this home."""
    mine = paths.socket_path()
    found = (client.ask(frames.STATUS, str(p)) for p in paths.sockets() if p != mine)
    return [status for status in found if status is not None]


def _stop_one(path: Path) -> Optional[int]:
    """Ends the daemon on ``path``; its pid, or None when none listened there."""
    status = client.ask(frames.STATUS, str(path))
    if status is None or client.ask(frames.STOP, str(path)) is None:
        return None
    # The daemon closes every host's channel before it stops listening.
    gone = time.monotonic() + 10
    while time.monotonic() < gone and client.ask(frames.STATUS, str(path)) is not None:
        time.sleep(0.05)
    return int(status["pid"])
