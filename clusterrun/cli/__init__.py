"""The command line. This is the only place exceptions become exit statuses."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

import click

from clusterrun import __version__, usage
from clusterrun.cli import complete, failure
from clusterrun.cli.common import CONTEXT
from clusterrun.cli.failure import Failure
from clusterrun.cli.lazy import Commands
from clusterrun.errors import ClusterrunError, ExitStatus, Outcome, Result, exit_status
from clusterrun.home import home as state_home
from clusterrun.home import home_setting
from clusterrun.runs import connections

# Each command's module is imported when that command runs (or --help lists them all).
COMMANDS = Commands({
    "check": "clusterrun.cli.hosts:check", "env": "clusterrun.cli.envs:env",
    "exec": "clusterrun.cli.hosts:exec_", "hosts": "clusterrun.cli.hosts:hosts",
    "launch": "clusterrun.cli.launch:launch", "logs": "clusterrun.cli.runs:logs",
    "ps": "clusterrun.cli.runs:ps", "pull": "clusterrun.cli.pull:pull",
    "sandbox": "clusterrun.cli.sandbox:sandbox", "session": "clusterrun.cli.session:session",
    "stacks": "clusterrun.cli.stacks:stacks", "stop": "clusterrun.cli.runs:stop",
    "top": "clusterrun.cli.observe:top",
})


@click.group(context_settings=CONTEXT, commands=COMMANDS)
@click.version_option(__version__, "-V", "--version", prog_name="clusterrun")
def cli() -> None:
    """Launch one PyTorch training script on many machines over SSH.

    \b
    clusterrun check INVENTORY          preflight every host
    clusterrun launch INVENTORY SCRIPT  run SCRIPT with torchrun on every host
    clusterrun logs -f                  follow the latest run's logs
    """
    from clusterrun import transport
    from clusterrun.session import paths

    # With the warm session on, every command reaches its SSH hosts through the daemon.
    if paths.enabled():
        from clusterrun.session import client

        transport.route = client.connector
    else:
        transport.route = None


def _inside(folder: Path, path: str) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the stretches that record it (a launch's watch, `exec`): unwinds like
    Ctrl-C, so connections and files are closed, instead of the default action's instant
    death with no word."""


def _terminated(_signum: int, _frame: object) -> None:
    raise Terminated()


def _interrupted(exc: BaseException) -> Failure:
    """The status and word for Ctrl-C or SIGTERM that reached the top (click wraps both in
    Abort), the word said here."""
    cause = exc if isinstance(exc, KeyboardInterrupt) else exc.__context__
    if isinstance(cause, Terminated):
        click.echo("clusterrun: terminated (SIGTERM)", err=True)
        return Failure(int(ExitStatus.SIGTERM), Outcome.TERMINATED.label, "terminated (SIGTERM)")
    said = "clusterrun: interrupted" if isinstance(cause, KeyboardInterrupt) else "Aborted."
    click.echo(said, err=True)
    return Failure(int(ExitStatus.SIGINT), Outcome.INTERRUPTED.label, "interrupted")


def _said(failure: Failure) -> Failure:
    click.echo(f"clusterrun: error: {failure.message}", err=True)
    return failure


def _home_error(exc: OSError) -> Optional[Failure]:
    """An OSError on a path in $CLUSTERRUN_HOME (a run directory another user made, a file
    where a directory belongs): the paragraph for the home itself. None for any other path:
    a bug, shown with its traceback."""
    from clusterrun.runs import store

    if not exc.filename or not _inside(state_home(), str(exc.filename)):
        return None
    error = (store.unusable(state_home(), exc.filename) if isinstance(exc, PermissionError)
             else store.home_error(state_home(), exc))
    return _said(Failure(error.exit_status, error.kind, error.message))


def _run(argv: list[str]) -> tuple[int, Optional[Failure]]:
    """The command's exit status, and what failed (None when it came to a Result)."""
    try:
        with connections.held():  # the connections to a run's hosts: closed when it ends
            status = cli.main(args=argv, prog_name="clusterrun", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code, None
    except click.UsageError as exc:
        return ExitStatus.USAGE, _said(Failure(int(ExitStatus.USAGE), Outcome.USAGE.label,
                                               usage.from_click(exc).message))
    except click.ClickException as exc:
        exc.show()
        outcome = Outcome.USAGE if exc.exit_code == ExitStatus.USAGE else Outcome.INTERNAL
        return exc.exit_code, Failure(exc.exit_code, outcome.label, exc.format_message())
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        said = _interrupted(exc)
        return said.exit_status, said
    except ClusterrunError as exc:
        return exc.exit_status, _said(Failure(exc.exit_status, exc.kind, exc.message))
    except BrokenPipeError:
        sys.stderr.close()  # a closed pager or `| head`: not an error worth a traceback
        return ExitStatus.SUCCESS, None
    except OSError as exc:
        found = _home_error(exc)
        if found is None:
            raise
        return found.exit_status, found
    return (exit_status(status) if isinstance(status, Result) else ExitStatus.SUCCESS), None


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the CLI and turn every outcome into an exit status: a command's Result
    through ``errors.exit_status`` (the one mapping), an error through its outcome. With
    --json, an error is also one JSON document on stdout (cli/failure.py)."""
    if os.environ.get(complete.COMPLETE_VAR):  # the shell asks for candidates (or a script)
        complete.run(cli)
    signal.signal(signal.SIGTERM, _terminated)
    # Ctrl-C too, where this process was started with SIGINT ignored (a script's background
    # job, some test runners' workers): a launch's watch takes it in any case (Interrupts), so
    # preflight does as well.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("CLUSTERRUN_HOME"):
        # A relative home is this directory's: the processes this one starts (a detached run's
        # hub, --notify, the warm session) keep the same one wherever they run.
        os.environ["CLUSTERRUN_HOME"] = home_setting()
    args = list(sys.argv[1:] if argv is None else argv)
    as_json, stream = failure.wants_json(cli, args), failure.is_stream(cli, args)
    stdout = sys.stdout
    watched = failure.Watched(stdout)
    if as_json:
        sys.stdout = watched
    try:
        status, failed = _run(args)
    except Exception as exc:  # a bug: its traceback follows, and the document still comes
        if as_json and (stream or not watched.written):
            sys.stdout = stdout
            failure.emit(Failure(int(ExitStatus.ERROR), Outcome.INTERNAL.label,
                                 f"internal error: {exc!r}"), stream=stream)
        raise
    finally:
        sys.stdout = stdout
    # One document: a command that printed its own (check's report, then a failed smoke test)
    # keeps it; a stream ends with the error's line.
    if as_json and failed is not None and (stream or not watched.written):
        failure.emit(failed, stream=stream)
    sys.exit(status)
