"""The only place shell command strings are built.

sshd runs every command as ``$SHELL -c STRING``, so each value that reaches a remote shell goes
through ``shlex.quote`` here. Better still, user data (script arguments, environment values,
secrets) never goes through a shell at all: it travels as JSON on the remote program's stdin.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from importlib import resources
from typing import Any, Optional

# Exit status of the remote wrapper when the inventory's `setup:` snippet fails.
SETUP_FAILED = 97

# Reads a length-prefixed Python program from stdin and runs it: the same short command line on
# every host, nothing secret in `ps`, and stdin stays open afterwards as the control channel.
BOOTSTRAP = (
    "import sys;n=int(sys.stdin.buffer.readline());"
    "exec(compile(sys.stdin.buffer.read(n),'<clusterrun>','exec'))"
)


def join(argv: Sequence[str]) -> str:
    """Quote every word: the shell sees exactly these arguments, whatever they contain."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def _with_setup(setup: Optional[str], body: str) -> str:
    """``body`` after the inventory's ``setup:`` snippet, in bash (venv and conda activation
    scripts need it). Setup's stdout goes to stderr so the program's stdout stays clean."""
    if not setup:
        return body
    script = (
        f"{{ {setup}\n}} >&2 || {{ echo \"clusterrun: the inventory's setup: failed (exit $?)\" "
        f">&2; exit {SETUP_FAILED}; }}\n{body}"
    )
    return join(["exec", "bash", "-c", script])


def remote_python(python: str, setup: Optional[str]) -> str:
    """Run a clusterrun helper program with the host's interpreter; see ``program_input``."""
    return _with_setup(setup, join(["exec", python, "-u", "-c", BOOTSTRAP]))


def remote_shell(setup: Optional[str], command: str) -> str:
    """A user's shell command (``clusterrun exec``), after setup. It is a shell command on
    purpose: the user wrote it for a shell."""
    return _with_setup(setup, command)


def program_input(name: str, request: dict[str, Any]) -> bytes:
    """What to write to the stdin of ``remote_python``: the program, then its request."""
    source = resources.files("clusterrun.remote").joinpath(name).read_bytes()
    return b"%d\n" % len(source) + source + json.dumps(request).encode() + b"\n"
