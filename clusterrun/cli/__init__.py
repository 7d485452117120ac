"""The command line. This is the only place exceptions become exit statuses."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

import click

from clusterrun import __version__, usage
from clusterrun.cli import envs, hosts, launch, observe, runs, sandbox, stacks
from clusterrun.cli.common import CONTEXT
from clusterrun.errors import ClusterrunError, ExitStatus, Result, exit_status
from clusterrun.home import home as state_home
from clusterrun.runs import connections


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="clusterrun")
def cli() -> None:
    """Launch one PyTorch training script on many machines over SSH.

    \b
    clusterrun check INVENTORY          preflight every host
    clusterrun launch INVENTORY SCRIPT  run SCRIPT with torchrun on every host
    clusterrun logs -f                  follow the latest run's logs
    """


for command in (hosts.check, launch.launch, hosts.exec_, hosts.hosts, runs.logs, runs.ps,
                runs.stop, stacks.stacks, observe.top, envs.env, sandbox.sandbox):
    cli.add_command(command)


def _inside(folder: Path, path: str) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the stretches that record it (a launch's watch, `exec`): unwinds like
    Ctrl-C, so connections and files are closed, instead of the default action's instant
    death with no word."""


def _terminated(_signum: int, _frame: object) -> None:
    raise Terminated()


def _interrupted(exc: BaseException) -> int:
    """The status and word for Ctrl-C or SIGTERM that reached the top (click wraps both in
    Abort)."""
    cause = exc if isinstance(exc, KeyboardInterrupt) else exc.__context__
    if isinstance(cause, Terminated):
        click.echo("clusterrun: terminated (SIGTERM)", err=True)
        return int(ExitStatus.SIGTERM)
    click.echo("clusterrun: interrupted" if isinstance(cause, KeyboardInterrupt) else "Aborted.",
               err=True)
    return int(ExitStatus.SIGINT)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the CLI and turn every outcome into an exit status: a command's Result
    through ``errors.exit_status`` (the one mapping), an error through its outcome."""
    signal.signal(signal.SIGTERM, _terminated)
    # Ctrl-C too, where this process was started with SIGINT ignored (a script's background
    # job, some test runners' workers): a launch's watch takes it in any case (Interrupts), so
    # preflight does as well.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with connections.held():  # the connections to a run's hosts: closed when it ends
            status = cli.main(args=argv, prog_name="clusterrun", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        click.echo(f"clusterrun: error: {usage.from_click(exc).message}", err=True)
        sys.exit(ExitStatus.USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        sys.exit(_interrupted(exc))
    except ClusterrunError as exc:
        click.echo(f"clusterrun: error: {exc.message}", err=True)
        sys.exit(int(exc.exit_status))
    except BrokenPipeError:
        sys.stderr.close()  # a closed pager or `| head`: not an error worth a traceback
        sys.exit(ExitStatus.SUCCESS)
    except PermissionError as exc:
        # Anything in $CLUSTERRUN_HOME that is not ours (a run directory another user made):
        # the same error as for the directory itself. Anything else is a bug: a traceback.
        from clusterrun.runs import store

        if not exc.filename or not _inside(state_home(), exc.filename):
            raise
        click.echo(f"clusterrun: error: {store.unusable(state_home(), exc.filename).message}",
                   err=True)
        sys.exit(ExitStatus.USAGE)
    sys.exit(exit_status(status) if isinstance(status, Result) else ExitStatus.SUCCESS)
