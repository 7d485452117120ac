"""Issue 9, host side: `--local_rank` inserted by rank.sh (CLUSTERRUN_LOCAL_RANK_AT), and
`--no-torchrun`, where the supervisor's own launcher (clusterrun/remote/node/spawn.py) starts
the ranks. Through the real rank.sh and the real supervisor on the local transport: no root,
no sshd."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from clusterrun import wire
from clusterrun.remote.node import run
from tests.conftest import Remote, state_of, wait_gone

# Words a shell would mangle: each must reach the script exactly as it was given.
HOSTILE = ["", " ", "a b", "two  spaces", "tab\there", "new\nline", "'", '"', "\\", "\\n",
           "$(touch pwned)", "`touch pwned`", "$HOME", "${PATH}", "*", "?", "~", ";", "&&",
           "|", ">x", "-n", "-e", "--", "-", "--lr", "0.1", '{"lr": 0.1}', "{rank}", "%s%n",
           "--local_rank=9", "é ✓"]
# Prints what the rank got: its arguments after `-c CODE`, the environment torchrun would have
# given it, and whether the node's secret arrived (and leaked onto any command line here).
REPORT = r"""
import hashlib, json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "NODE_ONLY")
secret = os.environ.get("HF_TOKEN", "").encode()
leaks = []
for pid in os.listdir("/proc"):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            if secret and secret in handle.read():
                leaks.append(pid)
    except OSError:
        pass
print(json.dumps({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys},
                  "secret": hashlib.sha256(secret).hexdigest(), "leaks": leaks}))
"""
CANARY = "hf_canary_6d1f0c2b9e"


def torch_env(rank: int, *, nproc: int = 2) -> dict[str, str]:
    """What the controller sends for one process of node 0 of a one-node job."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "NODE_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512",
            "TORCHELASTIC_RESTART_COUNT": "0"}


def no_torchrun_request(tmp_path: Path, mark: str, argvs: list[list[str]], *, grace: float = 2,
                        env: dict[str, str] | None = None) -> dict[str, Any]:
    """A `--no-torchrun` request: one entry per process, no argv of its own."""
    return {"node": "n0", "rundir": str(tmp_path / "n0" / "run"), "cwd": str(tmp_path),
            "ranks": [{"argv": argv, "env": torch_env(r, nproc=len(argvs))}
                      for r, argv in enumerate(argvs)],
            "python": sys.executable, "env": {"CLUSTERRUN_TEST_MARK": mark, **(env or {})},
            "public": {"name": "n0"}, "grace": grace, "lease": 10, "heartbeat": 0.5}


def report_of(remote: Remote, rank: int) -> dict[str, Any]:
    return json.loads(remote.data[f"rank-{rank}.log"])


def sh(command: str) -> list[str]:
    return ["/bin/sh", "-c", command]


def wait_for_file(path: Path, timeout: float = 30) -> None:
    """Until a process has written ``path``: what it did before that has happened."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def rank_exits(remote: Remote) -> dict[int, wire.RankExit]:
    return {e.rank: e for e in remote.events if isinstance(e, wire.RankExit)}


# ------------------------------------------------------------------ rank.sh: --local_rank


def run_rank_sh(tmp_path: Path, words: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """The real rank.sh, as torchrun runs it, around `python -c REPORT WORDS...`; its exit
    status and what the rank wrote."""
    rundir = tmp_path / "run"
    run.prepare({"rundir": str(rundir)})
    argv = ["/bin/sh", str(rundir / "rank.sh"), sys.executable, "-c", REPORT, *words]
    full = {"PATH": os.environ["PATH"], "CLUSTERRUN_RUNDIR": str(rundir), "RANK": "5", **env}
    proc = subprocess.run(argv, env=full, cwd=tmp_path, timeout=30, check=False)
    assert (rundir / "rank-5.exit").read_text() == f"{proc.returncode}\n"
    return proc.returncode, (rundir / "rank-5.log").read_bytes()


# Words 0-2 of the command are `python -c REPORT`: k=3 is right before the script's arguments.
@pytest.mark.parametrize(("at", "words", "expected"), [
    ("3", HOSTILE, ["--local_rank=1", *HOSTILE]),
    ("3", [], ["--local_rank=1"]),
    ("5", HOSTILE, [*HOSTILE[:2], "--local_rank=1", *HOSTILE[2:]]),
    (str(3 + len(HOSTILE)), HOSTILE, [*HOSTILE, "--local_rank=1"]),
    ("99", ["-x"], ["-x", "--local_rank=1"]),
    ("003", ["-x"], ["--local_rank=1", "-x"]),
])
def test_rank_sh_inserts_local_rank_and_keeps_every_other_word(
        tmp_path: Path, at: str, words: list[str], expected: list[str]) -> None:
    code, log = run_rank_sh(tmp_path, words, {"CLUSTERRUN_LOCAL_RANK_AT": at,
                                              "LOCAL_RANK": "1"})
    assert code == 0, log
    assert json.loads(log)["argv"] == expected
    assert not (tmp_path / "pwned").exists()


def test_rank_sh_keeps_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    words = [os.fsdecode(b"\xff\xfe raw"), os.fsdecode(b"\x01\x7f"), "x"]
    code, log = run_rank_sh(tmp_path, words, {"CLUSTERRUN_LOCAL_RANK_AT": "4",
                                              "LOCAL_RANK": "0"})
    assert code == 0, log
    assert json.loads(log)["argv"] == [words[0], "--local_rank=0", *words[1:]]


def test_rank_sh_without_the_variable_changes_nothing(tmp_path: Path) -> None:
    code, log = run_rank_sh(tmp_path, HOSTILE, {"LOCAL_RANK": "1"})
    assert code == 0, log
    assert json.loads(log)["argv"] == HOSTILE


@pytest.mark.parametrize("env", [{"CLUSTERRUN_LOCAL_RANK_AT": "3x", "LOCAL_RANK": "1"},
                                 {"CLUSTERRUN_LOCAL_RANK_AT": "-1", "LOCAL_RANK": "1"},
                                 {"CLUSTERRUN_LOCAL_RANK_AT": "3"}])
def test_rank_sh_refuses_what_is_not_a_number(tmp_path: Path, env: dict[str, str]) -> None:
    """The rank fails visibly (status 2, a line in its log) instead of running without it."""
    code, log = run_rank_sh(tmp_path, ["-x"], env)
    assert code == 2
    assert log.startswith(b"clusterrun: rank.sh: not numbers: LOCAL_RANK=")


# ------------------------------------------------------------------ --no-torchrun


def test_two_processes_succeed_with_torchruns_environment(tmp_path: Path, mark: str) -> None:
    argv = [sys.executable, "-c", REPORT, *HOSTILE]
    req = no_torchrun_request(tmp_path, mark, [argv, argv],
                              env={"NODE_ONLY": "node value", "HF_TOKEN": CANARY})
    remote = Remote("run.py", req)
    started = remote.wait_for(wire.Started)
    assert started.torchrun_pid and started.subreaper
    end = remote.end(timeout=30)
    assert (end.state, end.exit_code) == ("succeeded", 0)
    assert end.ranks == {0: 0, 1: 0}
    for rank in (0, 1):
        got = report_of(remote, rank)
        assert got["argv"] == HOSTILE
        assert got["env"] == {**torch_env(rank), "NODE_ONLY": "node value"}
        assert got["secret"] == hashlib.sha256(CANARY.encode()).hexdigest()
        assert got["leaks"] == []  # on no command line of this machine while it ran
    assert not (tmp_path / "pwned").exists()
    state = state_of(req)
    assert state["torchrun_pid"] == started.torchrun_pid and state["torchrun_exit_code"] == 0
    assert b"clusterrun launcher: started rank 0 (pid" in remote.data["node.log"]
    # The node's environment, the secret with it, is in no file of the run.
    for path in Path(req["rundir"]).rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
    assert wait_gone(mark, 5) == []


def test_local_rank_arg_without_torchrun(tmp_path: Path, mark: str) -> None:
    """Should the controller send CLUSTERRUN_LOCAL_RANK_AT with --no-torchrun, rank.sh applies
    it: once per process, nothing else changes."""
    argv = [sys.executable, "-c", REPORT, "--lr", "0.1"]
    req = no_torchrun_request(tmp_path, mark, [argv, argv],
                              env={"CLUSTERRUN_LOCAL_RANK_AT": "3"})
    remote = Remote("run.py", req)
    assert remote.end(timeout=30).state == "succeeded"
    for rank in (0, 1):
        assert report_of(remote, rank)["argv"] == [f"--local_rank={rank}", "--lr", "0.1"]


def test_a_failing_process_tears_down_the_other(tmp_path: Path, mark: str) -> None:
    req = no_torchrun_request(tmp_path, mark, [sh("sleep 100"),
                                               sh("sleep 0.5; echo last words; exit 3")])
    remote = Remote("run.py", req)
    remote.wait_for(wire.Started)
    failed = remote.wait_for(wire.RankExit, timeout=20)
    seen = time.monotonic()
    end = remote.end(timeout=30)
    # The launcher stopped rank 0 itself: the supervisor never had to (after its 5 s it would
    # have, and recorded why).
    assert end.cause is None
    assert time.monotonic() - seen < 30
    assert (failed.rank, failed.code, failed.stopping) == (1, 3, False)
    assert (end.state, end.exit_code) == ("failed", 3)
    assert end.reason == "n0 rank 1 exited with code 3"
    assert remote.data["rank-1.log"] == b"last words\n"
    state = state_of(req)
    assert state["cause"] is None and state["torchrun_exit_code"] == 3
    assert b"rank 1 exited with status 3: stopping the other 1" in remote.data["node.log"]
    assert wait_gone(mark, 5) == []
    assert not Path(f"/proc/{state['torchrun_pid']}").exists()  # the launcher, reaped


@pytest.mark.parametrize("how", ["stop", "eof"])
def test_a_stop_or_a_lost_lifeline_ends_everything_within_the_grace_period(
        tmp_path: Path, mark: str, how: str) -> None:
    """Rank 1 ignores SIGTERM: SIGKILL ends it once the grace period is over."""
    ignoring = tmp_path / "ignoring-term"
    req = no_torchrun_request(tmp_path, mark, [
        sh("sleep 100"), sh(f"trap '' TERM; : > {ignoring}; sleep 100")], grace=1)
    remote = Remote("run.py", req)
    remote.wait_for(wire.Started)
    wait_for_file(ignoring)  # the trap is in place: SIGTERM alone cannot end rank 1
    asked = time.monotonic()
    if how == "stop":
        remote.send(op="stop")
    else:
        remote.proc.close_stdin()
    end = remote.end()
    assert 1 <= time.monotonic() - asked < 1 + 10  # the grace, not the job's `sleep 100`
    if how == "stop":
        assert (end.state, end.cause) == ("stopped", "controller")
    else:
        assert (end.state, end.cause) == ("lost", "lifeline_eof")
    assert all(e.stopping for e in rank_exits(remote).values())
    assert not (Path(req["rundir"]) / "rank-1.exit").exists()  # SIGKILLed, rank.sh and all
    assert wait_gone(mark, 5) == []


def test_sigterm_to_the_launcher_reaches_every_process(tmp_path: Path, mark: str) -> None:
    """Like torchrun: the signal goes on to each process, and the launcher exits 128 + 15."""
    up = [tmp_path / "up-0", tmp_path / "up-1"]
    req = no_torchrun_request(tmp_path, mark, [sh(f": > {up[0]}; sleep 100"),
                                               sh(f": > {up[1]}; sleep 100")])
    remote = Remote("run.py", req)
    started = remote.wait_for(wire.Started)
    for path in up:  # both processes run: the signal has two to reach
        wait_for_file(path)
    # The launcher kept none of the supervisor's files: no socket, no pipe, no lifeline.
    assert sorted(os.listdir(f"/proc/{started.torchrun_pid}/fd")) == ["0", "1", "2"]
    os.kill(started.torchrun_pid, signal.SIGTERM)
    end = remote.end()
    assert (end.state, end.exit_code) == ("failed", 128 + signal.SIGTERM)
    assert end.reason == "n0: launcher was killed by signal 15 (SIGTERM)"
    assert b"got SIGTERM: passing it on to 2 processes" in remote.data["node.log"]
    assert wait_gone(mark, 5) == []


def test_detached_the_hub_names_the_failing_process(tmp_path: Path, mark: str) -> None:
    req = no_torchrun_request(tmp_path, mark, [sh("sleep 100"), sh("sleep 0.5; exit 3")])
    req.update(detach=True, gang={"role": "hub", "secret": "s3cret", "peers": [],
                                  "addr": "127.0.0.1", "port": None})
    Remote("run.py", req).wait_for(wire.Started)
    deadline = time.monotonic() + 20
    while not state_of(req).get("ended_at") and time.monotonic() < deadline:
        time.sleep(0.1)
    state = state_of(req)
    assert (state["state"], state["exit_code"]) == ("failed", 3)
    root = state["root_cause"]
    assert (root["node"], root["rank"], root["code"]) == ("n0", 1, 3)
    assert wait_gone(mark, 5) == []


def test_the_launcher_kills_what_ignores_sigterm_after_its_grace(tmp_path: Path,
                                                                 mark: str) -> None:
    """The launcher on its own, in a process of its own: a process that survives SIGTERM is
    killed when the launcher's grace period is over."""
    rundir = tmp_path / "run"
    run.prepare({"rundir": str(rundir)})
    ignoring = tmp_path / "ignoring-term"
    # Rank 1 fails only once rank 0's trap is in place: SIGTERM alone cannot end rank 0.
    ranks = [{"argv": sh(f"trap '' TERM; : > {ignoring}; sleep 100"), "env": {"RANK": "0"}},
             {"argv": sh(f"while [ ! -e {ignoring} ]; do sleep 0.01; done; exit 3"),
              "env": {"RANK": "1"}}]
    code = ("import json, sys; from clusterrun.remote.node import spawn; "
            "sys.exit(spawn.run(json.loads(sys.argv[1]), sys.argv[2], dict(__import__('os')"
            ".environ, CLUSTERRUN_RUNDIR=sys.argv[2]), grace=0.5))")
    begun = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(ranks), str(rundir)],
                          env={**os.environ, "CLUSTERRUN_TEST_MARK": mark}, timeout=30,
                          check=False, capture_output=True)
    assert proc.returncode == 3, proc.stderr
    # Killed after the launcher's grace, not left to run out its `sleep 100` (the bound is
    # loose on purpose: a loaded machine must not fail this).
    assert time.monotonic() - begun < 30
    assert (rundir / "rank-1.exit").read_text() == "3\n"
    # SIGKILL took rank 0's rank.sh too: it recorded no exit (SIGTERM would have been "143").
    assert not (rundir / "rank-0.exit").exists()
    assert wait_gone(mark, 5) == []


def test_a_command_that_does_not_exist_is_that_ranks_failure(tmp_path: Path,
                                                             mark: str) -> None:
    req = no_torchrun_request(tmp_path, mark, [sh("sleep 100"), ["/nonexistent/python", "-u"]])
    remote = Remote("run.py", req)
    end = remote.end(timeout=30)
    assert (end.state, end.exit_code) == ("failed", 127)
    assert end.reason == "n0 rank 1 exited with code 127"
    assert wait_gone(mark, 5) == []
