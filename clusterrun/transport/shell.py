"""The only place shell command strings are built.

sshd runs every command as ``$SHELL -c STRING``, so each value that reaches a remote shell goes
through ``shlex.quote`` here. Better still, user data (script arguments, environment values,
secrets) never goes through a shell at all: it travels as JSON on the remote program's stdin.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any, Optional

from clusterrun.errors import HostStatus
from clusterrun.inventory import HostSpec
from clusterrun.remote.shared import protocol
from clusterrun.transport import bundle

# Exit statuses of the remote wrapper (docs/exit-status.md, "On the hosts").
SETUP_FAILED = int(HostStatus.SETUP_FAILED)  # the inventory's `setup:` snippet failed
ENGINE_MISSING = int(HostStatus.ENGINE_MISSING)  # `container:` host without docker or podman

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
# The length line may carry flags: "c" (chain) says that when the program returns, the
# interpreter prints NEXT and waits for another program's length line instead of exiting, and
# then becomes a fresh interpreter (the same one, -S when that line says "S") that reads it.
# Every SSH channel runs the user's login shell (~/.bashrc: a `conda init` block starts a
# Python on every login), so the programs of one command share channels: the probe's becomes
# the supervisor. EOF in place of the next length line ends it. A program may leave its stdin
# non-blocking (mainloop does): the wait makes it blocking again.
# A fork of the warm session's agent finds W set (hostlib/warmrun.py): the length line, the
# program as the agent compiled it once, and the globals to run it in (a bundle's pieces
# unpacked there once, transport/bundle.py), and reads neither from stdin.
# An event frame, so that a stream of frames can end with it.
NEXT = protocol.EVENT + json.dumps({protocol.KIND: protocol.NEXT}).encode()
BOOT_BODY = r"""import os,sys
a=sys.argv[1:];w=globals().pop('W',None);g=w[2] if w else {'__name__':'__main__'}
h=(w[0] if w else a[0].encode() if a else sys.stdin.buffer.readline()).split()
exec(w[1] if w else compile(sys.stdin.buffer.read(int(h[0])),'<clusterrun>','exec'),g)
if b'c' in h[1:]:
 sys.stdout.flush();sys.stderr.flush();os.write(1,b'NEXT\n');h=b'';os.set_blocking(0,True)
 while h[-1:]!=b'\n':
  c=os.read(0,1)
  if not c:os._exit(0)
  h+=c
 x=sys.executable;s=['-S']*(b'S' in h.split()[1:])
 os.execv(x,[x]+s+['-u','-c','B=%r;exec(B)'%B,h.strip().decode()])
""".replace("NEXT", NEXT.decode())
BOOTSTRAP = f"B={BOOT_BODY!r};exec(B)"


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


# Asks a `container:` host, outside the container, about its engine and container: key=value
# lines (preflight/container.py reads them), `detail=` lines carrying what the engine said. POSIX
# sh: the host's own shell, whatever the container has. The engine is chosen as container_exec
# chooses it.
CONTAINER_CHECK = r"""
name=$1 python=$3 user=$4
say() { printf '%s=%s\n' "$1" "$2"; }
detail() { printf '%s\n' "$1" | tail -n 3 | sed 's/^/detail=/'; }
if [ -n "$2" ]; then engine=$2; else
""" + PICK_ENGINE + r"""
fi
say engine "$engine"
if [ -z "$engine" ] || ! command -v "$engine" >/dev/null 2>&1; then say error missing; exit 0; fi
if ! out=$("$engine" inspect --type container --format '{{.State.Status}}' "$name" 2>&1); then
  say error inspect; detail "$out"; exit 0
fi
say state "$out"
[ "$out" = running ] || exit 0
[ -n "$python" ] || exit 0
if out=$("$engine" exec ${user:+-u "$user"} "$name" "$python" -c \
    'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>&1); then
  say python "$out"
else
  say error python; detail "$out"
fi
"""


def container_check(spec: HostSpec) -> str:
    """The command line that runs CONTAINER_CHECK on ``spec``'s host. Its Python is asked for
    only without a ``setup:``, which may be what puts that interpreter on the PATH."""
    return join(["exec", "/bin/sh", "-c", CONTAINER_CHECK, "sh", spec.container or "",
                 spec.container_engine or "", "" if spec.setup else spec.python,
                 spec.container_user or ""])

def run_there(spec: HostSpec, argv: Sequence[str]) -> str:
    """The command line sshd runs for ``argv`` on ``spec``'s host: after its ``setup:``, in its
    container when it has one."""
    body = join(["exec", *argv])
    if not spec.container:
        return with_setup(spec.setup, body)
    inner = _setup_argv(spec.setup, body) if spec.setup else list(argv)
    return container_exec(spec, inner)


def remote_python(spec: HostSpec, *, site: bool = True) -> str:
    """Run a clusterrun helper program with the host's interpreter; see ``program_input``.
    ``site=False`` (-S) for the programs that need nothing beyond the standard library and no
    look at the installed packages: it spares each host the interpreter's site-packages scan
    (a venv's .pth files among them): about a fifth of its start-up."""
    return run_there(spec, [spec.python, *([] if site else ["-S"]), "-u", "-c", BOOTSTRAP])


def program_input(name: str, request: dict[str, Any], *, chain: bool = False,
                  site: Optional[bool] = None) -> bytes:
    """What to write to the stdin of ``remote_python``: the program, then its request.
    ``chain``: the interpreter waits for another program afterwards (see BOOTSTRAP). ``site``:
    for an interpreter that already ran one (it restarts with -S when False)."""
    source = bundle.program_source(name)
    flags = (b" c" if chain else b"") + (b" S" if site is False else b"")
    return b"%d%s\n" % (len(source), flags) + source + json.dumps(request).encode() + b"\n"
