"""The only place shell command strings are built.

sshd runs every command as ``$SHELL -c STRING``, so each value that reaches a remote shell goes
through ``shlex.quote`` here. Better still, user data (script arguments, environment values,
secrets) never goes through a shell at all: it travels as JSON on the remote program's stdin.
"""

from __future__ import annotations

import json
import re
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


def with_setup(setup: Optional[str], body: str) -> str:
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
    return with_setup(setup, join(["exec", python, "-u", "-c", BOOTSTRAP]))


# A remote program's `from clusterrun.remote import a, b`: modules shipped along with it.
_SHARED = re.compile(rb"^from clusterrun\.remote import ([\w, ]+)$", re.M)

# Registers the shipped modules under their real names before the program runs, so the programs
# import them exactly as they do on this machine (and tests and linters see plain imports).
_LOADER = b"""import sys, types
def _clusterrun_module(name, source):
    mod = types.ModuleType(name)
    mod.__file__ = "<clusterrun %s>" % name
    if source is None:
        mod.__path__ = []
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    if source is not None:
        exec(compile(source, mod.__file__, "exec"), mod.__dict__)
_clusterrun_module("clusterrun", None)
_clusterrun_module("clusterrun.remote", None)
"""


def _remote_source(name: str) -> bytes:
    return resources.files("clusterrun.remote").joinpath(name).read_bytes()


def _shared_modules(source: bytes, found: Optional[list[str]] = None) -> list[str]:
    """The clusterrun.remote modules ``source`` imports, dependencies first."""
    found = [] if found is None else found
    for match in _SHARED.finditer(source):
        for module in match.group(1).decode().replace(" ", "").split(","):
            if module and module not in found:
                _shared_modules(_remote_source(f"{module}.py"), found)
                if module not in found:
                    found.append(module)
    return found


def program_source(name: str) -> bytes:
    """A remote program as one piece of Python: itself, or a loader with the shared modules it
    imports (clusterrun/remote/common.py ...) followed by it."""
    source = _remote_source(name)
    shared = _shared_modules(source)
    if not shared:
        return source
    parts = [_LOADER]
    for module in shared:
        parts.append(b'_clusterrun_module("clusterrun.remote.%s", %r)\n' % (
            module.encode(), _remote_source(f"{module}.py")))
    parts.append(b"exec(compile(%r, \"<clusterrun %s>\", 'exec'), {'__name__': '__main__'})\n" % (
        source, name.encode()))
    return b"".join(parts)


def program_input(name: str, request: dict[str, Any]) -> bytes:
    """What to write to the stdin of ``remote_python``: the program, then its request."""
    source = program_source(name)
    return b"%d\n" % len(source) + source + json.dumps(request).encode() + b"\n"
