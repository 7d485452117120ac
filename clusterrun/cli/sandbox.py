"""`clusterrun sandbox up|down`: a local cluster of namespace hosts to try things on."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from clusterrun.cli.common import (
    CONTEXT,
    home,
)
from clusterrun.errors import UsageError


@click.group(context_settings=CONTEXT)
def sandbox() -> None:
    """A local simulated cluster: network namespaces + one sshd per host (Linux, root)."""


@sandbox.command("up", context_settings=CONTEXT)
@click.argument("n", type=click.IntRange(1, 250))
@click.option("--decoy", is_flag=True,
              help="Give every host a virbr0 with 192.168.122.1/24, as libvirt hosts have.")
@click.option("--rc-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, metavar="PATH",
              help="Give every host this ~/.bashrc (e.g. a `conda init` block), to see what "
              "a heavy shell setup costs each SSH command. By default hosts get a minimal one "
              "of their own, not this machine's.")
def sandbox_up(n: int, decoy: bool, rc_file: Optional[Path]) -> None:
    """Build N hosts and write an inventory under $CLUSTERRUN_HOME/sandbox/.

    Each host's ~/.bashrc (root's, mounted in the host's own mount namespace) counts its
    runs in $CLUSTERRUN_HOME/sandbox/NODE/logins: one line per run, the shell's pid and its
    parent's name (sshd for an SSH command's login).
    """
    from clusterrun import sandbox as sb

    root = home() / "sandbox"
    if (root / "sandbox.json").exists():
        raise UsageError(
            f"a sandbox already exists in {root}; remove it first with `clusterrun sandbox down`.")
    box = sb.up(n, root, decoy=decoy, rc_file=rc_file)
    click.echo(f"{n} hosts up: " + ", ".join(f"{h.name} {h.address} ({h.ifname})"
                                              for h in box.hosts))
    click.echo(f"inventory: {box.inventory}")
    click.echo(f"try: clusterrun check {box.inventory}")


@sandbox.command("down", context_settings=CONTEXT)
def sandbox_down() -> None:
    """Remove the sandbox cluster and everything running in it (exit 0 also when there is
    none: it says so)."""
    from clusterrun import sandbox as sb
    from clusterrun.sandbox.cluster import STATE_FILE

    root = home() / "sandbox"
    if not (root / STATE_FILE).exists():  # sb.down leaves a directory without state alone
        click.echo(f"no sandbox in {root}: nothing to remove (`clusterrun sandbox up N` "
                   "makes one)")
        return
    sb.down(root)
    click.echo(f"sandbox removed ({root})")
