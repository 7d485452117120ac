"""`clusterrun pull`: what a run's ranks wrote, copied back from its hosts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click

from clusterrun.cli import complete, selectors
from clusterrun.cli.common import CONTEXT, home, make_options, note, ssh_options
from clusterrun.errors import ClusterrunError, Result, UsageError
from clusterrun.runs import names

if TYPE_CHECKING:
    from clusterrun.pull.model import PullReport


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN", shell_complete=complete.run_ids)
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--to", "to", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="DIR", help="Copy into DIR/<node>/ (default: $CLUSTERRUN_HOME/runs/"
              "<run>/files/).")
@selectors.node_option
@selectors.rank_option
@click.option("--dry-run", is_flag=True,
              help="List per node the files that would move, and their sizes; move nothing.")
@click.option("--json", "as_json", is_flag=True,
              help='{"ok", "run", "to", "dry_run", "nodes": [{"node", "host", "status", '
                   '"method", "root", "dest", "files": [{"path", "size", "sha256", "moved"}], '
                   '"moved", "bytes", "unmatched", "error"}]}; on an error {"ok": false, '
                   '"error": {...}}.')
@ssh_options
def pull(run_id: str, paths: tuple[str, ...], to: Optional[Path], nodes: tuple[str, ...],
         ranks_: tuple[int, ...], dry_run: bool, as_json: bool, connect_timeout: float,
         accept_new_host_keys: bool) -> Result:
    """Copy what a run's ranks wrote back from every host into DIR/<node>/.

    By default, every file created or changed under the ranks' working directory on each host
    (where the script was copied) since the run began there: checkpoints, metrics, traces.
    The code clusterrun copied there, its own run state and logs (`clusterrun logs`) and
    Python's caches are left out. PATHs (relative to that directory; globs such as 'out/*.pt'
    are expanded on the host; a directory means everything under it) pick files instead,
    whenever they were written, the code included.

    Only files whose bytes differ from the copy here move (rsync where the host has it, else
    the SSH connection), and every file is checked against the host's size and SHA-256. A
    detached run may be pulled while it runs. A host that cannot be reached is named and the
    others are still pulled (exit status 4).
    """
    import json

    from clusterrun import pull as pulling
    from clusterrun.pull import view

    run = names.resolve(home(write=to is None and not dry_run), run_id, note=note)
    report = pulling.pull(run, make_options(connect_timeout, accept_new_host_keys), paths=paths,
                          to=to, nodes=nodes, ranks=ranks_, dry_run=dry_run,
                          say=note if not as_json else None)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in view.render(report):
            click.echo(line)
    _unmatched(report, paths)
    failed = pulling.outcome(report)
    if failed is None:
        return Result()
    bad = [n.error.rstrip(".") + "." for n in report.nodes if n.error]
    rest = [n.node for n in report.nodes if not n.error]
    done = "listed" if dry_run else "pulled"
    others = f"The other nodes ({', '.join(rest)}) were {done}; p" if rest else "P"
    raise ClusterrunError("\n".join(bad) + f"\n{others}ull again once the cause is fixed: only "
                          "what is missing or different moves.", outcome=failed)


def _unmatched(report: PullReport, paths: tuple[str, ...]) -> None:
    """A PATH that matched nothing on any node reached is a usage error."""
    reached = [n for n in report.nodes if not n.error]
    if not paths or not reached:
        return
    nowhere = [p for p in sorted({p for n in reached for p in n.unmatched})
               if all(p in n.unmatched for n in reached)]
    if nowhere:
        where = reached[0]
        raise UsageError(f"nothing matched {', '.join(nowhere)} on any node; PATHs are relative "
                         f"to the ranks' working directory on each host ({where.node}: "
                         f"{where.root}).")

