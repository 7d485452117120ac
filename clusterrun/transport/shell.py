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

from clusterrun.inventory import HostSpec

# Exit status of the remote wrapper when the inventory's `setup:` snippet fails.
SETUP_FAILED = 97
# ... and when a host with `container:` has neither docker nor podman.
ENGINE_MISSING = 96

# Sets $engine to the engine a host with `container:` and no `container_engine:` uses: docker
# when its daemon can be there (its socket, or DOCKER_HOST), else podman, else a docker client
# alone (whose error then says its daemon is missing). A docker CLI without a daemon is common
# beside podman; checking the socket costs nothing, unlike asking the daemon.
PICK_ENGINE = (
    'engine=; if command -v docker >/dev/null 2>&1 && { [ -n "${DOCKER_HOST:-}" ] '
    '|| [ -S /var/run/docker.sock ]; }; then engine=docker; '
    'elif command -v podman >/dev/null 2>&1; then engine=podman; '
    'elif command -v docker >/dev/null 2>&1; then engine=docker; fi'
)

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
    return join(["exec", *_setup_argv(setup, body)])


def _setup_argv(setup: str, body: str) -> list[str]:
    script = (
        f"{{ {setup}\n}} >&2 || {{ echo \"clusterrun: the inventory's setup: failed (exit $?)\" "
        f">&2; exit {SETUP_FAILED}; }}\n{body}"
    )
    return ["bash", "-c", script]


def container_exec(spec: HostSpec, argv: Sequence[str]) -> str:
    """``argv`` inside the host's running container, stdin attached (``docker exec -i`` /
    ``podman exec -i``), for the host's shell. Neither engine forwards signals or ends what it
    started when its client dies; the process inside sees EOF on stdin, which is why every
    clusterrun program there treats stdin as its lifeline."""
    assert spec.container is not None
    words = ["exec", "-i", *(["-u", spec.container_user] if spec.container_user else []),
             spec.container, *argv]
    if spec.container_engine:
        return join(["exec", spec.container_engine, *words])
    script = (
        f'{PICK_ENGINE}\n[ -n "$engine" ] && exec "$engine" "$@"\n'
        f'echo "clusterrun: neither docker nor podman is installed" >&2; exit {ENGINE_MISSING}'
    )
    return join(["exec", "/bin/sh", "-c", script, "sh", *words])


def run_there(spec: HostSpec, argv: Sequence[str]) -> str:
    """The command line sshd runs for ``argv`` on ``spec``'s host: after its ``setup:``, in its
    container when it has one."""
    body = join(["exec", *argv])
    if not spec.container:
        return with_setup(spec.setup, body)
    inner = _setup_argv(spec.setup, body) if spec.setup else list(argv)
    return container_exec(spec, inner)


def remote_python(spec: HostSpec) -> str:
    """Run a clusterrun helper program with the host's interpreter; see ``program_input``."""
    return run_there(spec, [spec.python, "-u", "-c", BOOTSTRAP])


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
