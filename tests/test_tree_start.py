"""How a supervisor starts its command (remote/hostlib/procs.py ``Tree.start``): by
posix_spawn where it can, which copies nothing of the supervisor's memory, and the command
must find exactly what the forked start gave it. Each case runs in a Python of its own: a Tree
makes its process a subreaper and reaps any child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What the command sees of its start: session, signals (ignored, blocked, caught), stdin,
# working directory, and which descriptors it holds open.
LOOK = ("set -- $(cat /proc/$$/stat); echo $(($1 == $6));"
        # read by sh itself: a child would race sh's own blocking of signals around a fork
        " while IFS= read -r l; do case $l in SigIgn*|SigBlk*|SigCgt*) echo \"$l\";; esac;"
        " done < /proc/$$/status; readlink /proc/$$/fd/0; pwd -P;"
        " ls /proc/$$/fd | wc -l; echo \"$X\"; echo err >&2")

# Starts LOOK (or argv given as JSON) with a Tree from FROM, in CWD; prints which way it went
# and what the command wrote.
SCRIPT = r"""
import json, os, signal, sys, time
from clusterrun.remote.hostlib import procs
way = sys.argv[1]
argv = json.loads(sys.argv[2])
os.chdir(sys.argv[3])
signal.signal(signal.SIGTERM, lambda *a: None)  # caught here, as the supervisor's loop does
if way == "fork":
    procs.Tree._spawn = lambda *a: None
forked = []
real_fork = os.fork
def fork():
    forked.append(1)
    return real_fork()
os.fork = fork
out = os.open("out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
err = os.open("err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
tree = procs.Tree()
env = dict(os.environ, X="from env")
pid = tree.start(argv, env, sys.argv[4], out, err)
while not tree.reap():
    time.sleep(0.01)
print(json.dumps({"forked": bool(forked), "code": tree.code, "pid": pid > 0,
                  "out": open("out").read(), "err": open("err").read()}))
"""


# glibc's posix_spawn leaves its two internal signals (32 and 33, below SIGRTMIN: no program
# may use them; glibc installs its handlers for them when it needs them) ignored in the child:
# the one thing in which a command started that way differs.
GLIBC_INTERNAL = (1 << 31) | (1 << 32)


def _start(way: str, tmp_path: Path, argv: list[str], cwd: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, way, json.dumps(argv), str(tmp_path),
                           str(cwd)], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    started: dict[str, object] = json.loads(done.stdout)
    lines = str(started["out"]).splitlines()
    for at, line in enumerate(lines):
        if line.startswith("SigIgn:"):
            lines[at] = "SigIgn: %x" % (int(line.split()[1], 16) & ~GLIBC_INTERNAL)
    started["out"] = "\n".join(lines)
    return started


def test_a_command_starts_without_a_fork_and_sees_what_a_fork_gave_it(tmp_path: Path) -> None:
    spawned = _start("spawn", tmp_path, ["sh", "-c", LOOK], tmp_path)
    forked = _start("fork", tmp_path, ["sh", "-c", LOOK], tmp_path)
    assert (spawned["forked"], forked["forked"]) == (False, True)
    assert {**spawned, "forked": None} == {**forked, "forked": None}
    lines = str(spawned["out"]).splitlines()
    assert lines[0] == "1" and lines[-1] == "from env" and spawned["err"] == "err\n"
    # SIGXFSZ ignored, as Python leaves it; SIGPIPE not. (What the test's own process was
    # started with passes through both ways too: a background job of a shell ignores SIGQUIT.)
    ignored = int(lines[2].split()[1], 16)
    assert ignored & (1 << (signal.SIGXFSZ - 1)) and not ignored & (1 << (signal.SIGPIPE - 1))
    assert lines[4] == os.devnull and lines[5] == str(tmp_path.resolve())


@pytest.mark.parametrize("argv", [["no-such-command-here"], ["/no/such/file"],
                                  ["sh", "-c", "exit 3"]])
def test_a_command_that_cannot_start_is_reported_as_before(tmp_path: Path,
                                                           argv: list[str]) -> None:
    spawned = _start("spawn", tmp_path, argv, tmp_path)
    forked = _start("fork", tmp_path, argv, tmp_path)
    assert {**spawned, "forked": None} == {**forked, "forked": None}


def test_a_command_started_elsewhere_is_forked_there(tmp_path: Path) -> None:
    """posix_spawn cannot chdir: a command whose folder is not the supervisor's is forked."""
    started = _start("spawn", tmp_path, ["pwd", "-P"], Path("/"))
    assert started["forked"] is True and started["out"] == "/"
