"""The session's agent running clusterrun's programs in a fork of itself
(remote/hostlib/warmrun.py): each case runs once that way and once as the direct path does
(``/bin/sh -c 'exec python -u -c BOOTSTRAP'``), and both must look the same from outside."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun.inventory import HostSpec
from clusterrun.remote.hostlib import warmrun
from clusterrun.remote.shared import frames
from clusterrun.session.client import SessionTransport
from clusterrun.session.hostlink import run_request
from clusterrun.transport import bundle, programs, shell
from clusterrun.transport.base import SshOptions

# What tells a fork of the agent from a new interpreter: loaded in the agent, never by -S.
WARM_ONLY = "ctypes"


class Agent:
    """hostagent.py in a local interpreter, started as the daemon starts it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-u", "-c", shell.BOOTSTRAP],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.send(None, 0, shell.program_input(
            "hostagent.py", {"silence": 30.0, "bootstrap": shell.BOOT_BODY,
                             "loader": bundle.LOADER_DEFS.decode()}))
        hello = self.frame()
        assert hello is not None and hello[:2] == (frames.PONG, 0)
        self.pid = frames.loads(hello[2])["pid"]

    def send(self, kind: Optional[int], rid: int, payload: bytes = b"") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(payload if kind is None else frames.encode(kind, rid, payload))
        self.proc.stdin.flush()

    def frame(self) -> Optional[frames.Frame]:
        assert self.proc.stdout is not None
        return frames.read_frame(self.proc.stdout.read)

    def program(self, rid: int, source: str, *, python: Optional[str], site: bool = False,
                stdin: bytes = b"", then: Optional[bytes] = None) -> dict[str, Any]:
        """Run ``source`` as BOOTSTRAP's program (``python``: the RUN names that interpreter,
        as the daemon does; None: a plain command); its output and exit. ``then``: the program
        is chained, and ``then`` goes to its stdin once it said NEXT."""
        command = shell.join(["exec", sys.executable, *([] if site else ["-S"]), "-u", "-c",
                              shell.BOOTSTRAP])
        request: dict[str, Any] = {"command": command}
        if python is not None:
            request.update({frames.PYTHON: python, frames.SITE: site})
        self.send(frames.RUN, rid, json.dumps(request).encode())
        code = source.encode()
        flags = b"" if then is None else b" c"
        self.send(frames.STDIN, rid, b"%d%s\n" % (len(code), flags) + code + stdin)
        if then is None:
            self.send(frames.EOF, rid)
        got: dict[str, Any] = {"out": b"", "err": b""}
        while True:
            frame = self.frame()
            assert frame is not None, "the agent ended early"
            kind, at, payload = frame
            assert at == rid
            if kind == frames.STDOUT:
                got["out"] += payload
                if then is not None and got["out"].endswith(shell.NEXT + b"\n"):
                    self.send(frames.STDIN, rid, then)
                    self.send(frames.EOF, rid)
                    then = None
            elif kind == frames.STDERR:
                got["err"] += payload
            elif kind == frames.EXIT:
                got["exit"] = frames.loads(payload)
                return got

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    made = Agent()
    yield made
    made.close()


CASES = {
    "returns": "import sys\nprint('ok', repr(sys.stdin.readline()), sys.stdout.line_buffering)",
    "reads stdin to its EOF": "import sys\ndata = sys.stdin.buffer.read()\nprint(len(data))",
    "raises": "def f():\n    raise ValueError('boom')\nf()",
    "exits with a number": "import sys\nprint('bye')\nsys.exit(300)",
    "exits with a message": "import sys\nsys.exit('clusterrun: no such run')",
    "is killed by a signal": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
    "is interrupted": "raise KeyboardInterrupt",
    "ends with atexit and a thread": (
        "import atexit, threading, time\natexit.register(print, 'atexit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()"),
    "runs in its own session from home": (
        "import os\nprint(os.getsid(0) == os.getpid(), os.getcwd(), os.getppid() > 1)"),
    "sees a clean interpreter": (
        "import sys\nprint(sys.argv, __name__, [m for m in sys.modules "
        "if m.startswith('clusterrun')], 'B' in dir(sys.modules['__main__']))"),
    "writes much": "import sys\nsys.stdout.write('x' * 300000)\nsys.stderr.write('y' * 300000)",
    "does not compile": "print('never'\ndef (",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_program_in_a_fork_looks_as_in_a_new_interpreter(agent: Agent, case: str) -> None:
    stdin = b"line\r\n" + b"z" * 100000
    forked = agent.program(1, CASES[case], python=sys.executable, stdin=stdin)
    direct = agent.program(2, CASES[case], python=None, stdin=stdin)
    assert forked == direct


def test_the_fork_has_the_programs_modules_loaded(agent: Agent) -> None:
    probe = f"import sys\nprint({WARM_ONLY!r} in sys.modules)"
    assert agent.program(1, probe, python=sys.executable)["out"] == b"True\n"
    assert agent.program(2, probe, python=None)["out"] == b"False\n"


def test_another_interpreter_is_started_as_a_command(agent: Agent, tmp_path: Path) -> None:
    """A RUN naming a python: that is not the agent's own (another venv) is not forked."""
    other = tmp_path / "python3"
    other.symlink_to(sys.executable)  # the same binary, another interpreter for a venv
    probe = f"import sys\nprint({WARM_ONLY!r} in sys.modules)"
    assert agent.program(1, probe, python=str(other))["out"] == b"False\n"


def test_site_is_set_up_as_without_dash_s(agent: Agent) -> None:
    probe = "import sys\nprint(sys.path, sys.prefix, 'exit' in dir(__builtins__))"
    forked = agent.program(1, probe, python=sys.executable, site=True)
    assert forked == agent.program(2, probe, python=None, site=True)
    assert forked["out"] != agent.program(3, probe, python=None)["out"]  # site made a change


def test_a_chained_program_starts_a_fresh_interpreter(agent: Agent) -> None:
    """After a program that leaves its interpreter waiting (``c``), the next one runs in a
    new interpreter, as BOOTSTRAP makes it."""
    second = b"import sys\nprint('second', 'ctypes' in sys.modules, sys.stdin.read())"
    then = b"%d\n" % len(second) + second + b"rest"
    forked = agent.program(1, "print('first')", python=sys.executable, then=then)
    assert forked == agent.program(2, "print('first')", python=None, then=then)
    assert forked["out"] == b"first\n" + shell.NEXT + b"\nsecond False rest\n"


def _spec(**fields: Any) -> HostSpec:
    return HostSpec(host="h", name="h", master=True, line=1, **fields)


def test_the_daemon_marks_only_programs_started_the_plain_way() -> None:
    plain = _spec(python="/opt/venv/bin/python")
    for site in (True, False):
        assert run_request(plain, shell.remote_python(plain, site=site)) == {
            "command": shell.remote_python(plain, site=site),
            frames.PYTHON: "/opt/venv/bin/python", frames.SITE: site}
    assert run_request(plain, "hostname") == {"command": "hostname"}
    for other in (_spec(setup="source /opt/env.sh"), _spec(container="trainer")):
        command = shell.remote_python(other, site=False)
        assert run_request(other, command) == {"command": command}


def _stdlib_imports(source: bytes) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - {"clusterrun", "os", "sys"}


@pytest.mark.parametrize("program", ["command.py", "probe.py", "run.py", "stackdump.py",
                                     "status.py", "stop.py", "tail.py", "outputs.py"])
def test_the_agent_loads_what_the_commands_programs_import(program: str) -> None:
    source = bundle._remote_source(bundle._program_path(program))
    needed = _stdlib_imports(source)
    for module in bundle._shared_modules(source):
        needed |= _stdlib_imports(bundle._remote_source(module))
    assert needed <= set(warmrun.WARM)


class _Proc:
    def __init__(self) -> None:
        self.stdin_closed = False

    def write(self, data: bytes) -> None:
        pass

    def close_stdin(self) -> None:
        self.stdin_closed = True

    def close(self) -> None:
        pass

    def recv_stderr(self, size: int) -> bytes:
        return b""


class _Transport:
    def __init__(self, forks: bool) -> None:
        self.forks_programs = forks
        self.runs: list[_Proc] = []

    def run(self, command: str) -> _Proc:
        self.runs.append(_Proc())
        return self.runs[-1]


@pytest.mark.parametrize("forks", [True, False])
def test_a_session_that_forks_programs_starts_one_anew_not_in_a_parked_one(forks: bool) -> None:
    """Where the agent forks programs, a new request beats the fresh interpreter a parked one
    would exec; elsewhere (a direct connection, a `setup:` host) the parked one saves a login."""
    transport: Any = _Transport(forks)
    first = programs.start(transport, _spec(), "status.py", {}, chain=True)
    programs.park(transport, first)
    second = programs.start(transport, _spec(), "stop.py", {})
    assert (second is not first, len(transport.runs), first.proc.stdin_closed) == (
        (True, 2, True) if forks else (False, 1, False))


def test_a_session_transport_says_where_its_agent_forks_programs() -> None:
    assert SessionTransport(_spec(), SshOptions()).forks_programs
    for other in (_spec(setup="source /opt/env.sh"), _spec(container="trainer")):
        assert not SessionTransport(other, SshOptions()).forks_programs


# The programs the agent keeps (warmrun.Programs; unit tests in test_session_kept.py).
# A bundle's program that says whether its loader was handed the agent's unpacked pieces.
SAYS_KEPT = ("import sys\nfrom clusterrun.remote.shared import timing\n"
             "loader = sys._getframe(1).f_globals\n"
             "print(bool(loader.get('_clusterrun_kept')), timing.__name__)\n")


def _bundle(main: str) -> bytes:
    """A program as bundle.py builds one, importing shared/timing.py."""
    return bundle._build("says.py", main.encode(), [
        ("shared/timing.py", bundle._remote_source("shared/timing.py"))])


def _run(agent: Agent, rid: int, program: bytes, *, warm: bool = True,
         pieces: int = 1) -> dict[str, Any]:
    """``program`` through the agent, its input cut in ``pieces`` STDIN frames."""
    command = shell.join(["exec", sys.executable, "-S", "-u", "-c", shell.BOOTSTRAP])
    request: dict[str, Any] = {"command": command}
    if warm:
        request.update({frames.PYTHON: sys.executable, frames.SITE: False})
    agent.send(frames.RUN, rid, json.dumps(request).encode())
    data = b"%d\n" % len(program) + program + b"rest of stdin\n"
    step = -(-len(data) // pieces)
    for at in range(0, len(data), step):
        agent.send(frames.STDIN, rid, data[at:at + step])
    agent.send(frames.EOF, rid)
    got: dict[str, Any] = {"out": b"", "err": b""}
    while True:
        frame = agent.frame()
        assert frame is not None and frame[1] == rid
        kind, _rid, payload = frame
        if kind == frames.EXIT:
            got["exit"] = frames.loads(payload)
            return got
        got["out" if kind == frames.STDOUT else "err"] += payload


def test_a_fork_runs_a_bundle_from_the_agents_unpacked_pieces(agent: Agent) -> None:
    program = _bundle(SAYS_KEPT + "print(sys.stdin.read())\n")
    out = b"True clusterrun.remote.shared.timing\nrest of stdin\n\n"
    assert _run(agent, 1, program)["out"] == out
    assert _run(agent, 2, program, pieces=7)["out"] == out  # the program in pieces
    assert _run(agent, 3, program, warm=False)["out"] == out.replace(b"True", b"False")


def test_a_program_cut_short_by_eof_fails_as_bootstrap_fails(agent: Agent) -> None:
    rid = 10
    for warm in (True, False):
        rid += 1
        agent.send(frames.RUN, rid, json.dumps({
            "command": shell.join(["exec", sys.executable, "-S", "-u", "-c", shell.BOOTSTRAP]),
            **({frames.PYTHON: sys.executable, frames.SITE: False} if warm else {})}).encode())
        agent.send(frames.STDIN, rid, b"100\nprint(")
        agent.send(frames.EOF, rid)
        got = b""
        while True:
            frame = agent.frame()
            assert frame is not None
            if frame[0] == frames.EXIT:
                assert frames.loads(frame[2])["status"] == 1
                break
            got += frame[2]
        assert b"SyntaxError" in got
