"""Programs that follow each other on a host share one interpreter, and so one login
(shell.BOOTSTRAP's chain, transport.programs' parking), here on this machine's own transport:
real interpreters, no sshd. tests/test_logins.py counts the logins on the namespace cluster."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from clusterrun.inventory import HostSpec
from clusterrun.transport import LocalTransport, programs, shell
from clusterrun.transport.programs import call
from tests.conftest import host_spec


def _local() -> tuple[LocalTransport, HostSpec]:
    spec = host_spec("localhost", "lo", python=sys.executable)
    return LocalTransport(spec), spec


def test_programs_called_in_turn_run_in_one_interpreter(tmp_path: Path) -> None:
    transport, spec = _local()
    (tmp_path / "a.txt").write_text("a")
    first = call(transport, spec, "status.py", {"rundir": str(tmp_path / "none")}, timeout=20)
    (waiting,) = programs._parked[transport]
    assert waiting.proc.wait(0) is None  # it waits for the next program
    # files.py wants no site (-S): the same process becomes a fresh interpreter with it.
    second = call(transport, spec, "files.py", {"root": str(tmp_path), "files": ["a.txt"]},
                  timeout=20, site=False)
    assert first == {"ev": "status", "state": None}
    assert list(second["manifest"]) == ["a.txt"] and second["manifest"]["a.txt"][0] == 1
    assert programs._parked[transport] == [waiting]  # the same process, parked again
    programs.release(transport)
    assert waiting.proc.wait(5) == 0  # EOF instead of a next program: it exits, cleanly
    assert transport not in programs._parked


def test_a_program_not_chained_exits_as_before() -> None:
    proc = subprocess.Popen([sys.executable, "-u", "-c", shell.BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    out, _ = proc.communicate(shell.program_input("status.py", {"rundir": "/nonexistent"}),
                              timeout=20)
    assert proc.returncode == 0 and shell.NEXT not in out


def test_the_probe_frees_its_ports_before_it_waits_for_the_next_program() -> None:
    """torchrun binds master_port in the supervisor that runs where the probe ran."""
    proc = subprocess.Popen([sys.executable, "-u", "-c", shell.BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(shell.program_input("probe.py", {"workdir": "/tmp"}, chain=True))
    proc.stdin.write(b'{"op": "listen", "addr": "127.0.0.1", "port": 0}\n'
                     b'{"op": "listen", "addr": "127.0.0.1", "port": 0}\n{"op": "exit"}\n')
    proc.stdin.flush()
    lines = [proc.stdout.readline() for _ in range(4)]
    assert lines[-1].rstrip(b"\n") == shell.NEXT  # it waits now
    for line in lines[1:3]:  # master_port's listener, then the lifeline's that replaced it
        with socket.socket() as sock:  # as torchrun's TCPStore binds it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("0.0.0.0", json.loads(line)["listen"]["port"]))
            sock.listen()
    proc.stdin.close()
    assert proc.wait(5) == 0
