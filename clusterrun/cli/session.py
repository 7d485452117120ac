"""`clusterrun session`: the warm session's daemon, what it holds, and ending it."""

from __future__ import annotations

import json
import time

import click

from clusterrun.cli.common import CONTEXT
from clusterrun.remote.shared import frames
from clusterrun.session import client, paths


@click.group(context_settings=CONTEXT, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.pass_context
def session(ctx: click.Context, as_json: bool) -> None:
    """The warm session: the per-user daemon that keeps one connection and one agent per host
    across commands (on with CLUSTERRUN_SESSION=1). Shows its pid, since when it runs, how long
    it has been idle, and the hosts it holds with their agent's pid."""
    if ctx.invoked_subcommand is not None:
        return
    status = client.ask(frames.STATUS)
    if as_json:
        click.echo(json.dumps({"running": status is not None, **(status or {})}))
        return
    if status is None:
        click.echo("no session running" + ("" if paths.enabled() else
                                           " (off: CLUSTERRUN_SESSION=1 turns it on)"))
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["since"]))
    click.echo(f"session daemon pid {status['pid']}, since {since}, idle {status['idle']:g} s "
               f"(exits after {status['idle_limit']:g} s)")
    hosts = status.get("hosts") or []
    width = max([len(h["name"]) for h in hosts] + [4])
    for host in hosts:
        state = f"agent pid {host['agent_pid']}" if host["alive"] else "connection lost"
        click.echo(f"  {host['name']:<{width}}  {host['address']:<15}  {state}")
    if not hosts:
        click.echo("  no hosts held")


@session.command(context_settings=CONTEXT)
def stop() -> None:
    """End the session now: its agents exit (EOF on their channel), connections close."""
    status = client.ask(frames.STATUS)
    if status is None or client.ask(frames.STOP) is None:
        click.echo("no session running")
        return
    # The daemon closes every host's channel before it stops listening.
    gone = time.monotonic() + 10
    while time.monotonic() < gone and client.ask(frames.STATUS) is not None:
        time.sleep(0.05)
    click.echo(f"session stopped (daemon pid {status['pid']})")
