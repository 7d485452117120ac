"""The warm session's frames and its host agent (remote/tools/hostagent.py), run here as a
subprocess with pipes, exactly as the daemon drives it over an SSH channel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from clusterrun.remote.shared import frames
from clusterrun.transport import shell


def test_frames_survive_any_cut_of_the_stream() -> None:
    stream = (frames.encode(frames.RUN, 7, b'{"command": "true"}') + frames.encode(frames.EOF, 1)
              + frames.encode(frames.STDOUT, 2 ** 32 - 1, b"x" * 70000))
    for step in (1, 3, 4096, len(stream)):
        reader = frames.Reader()
        got = []
        for at in range(0, len(stream), step):
            got += reader.feed(stream[at:at + step])
        assert got == [(frames.RUN, 7, b'{"command": "true"}'), (frames.EOF, 1, b""),
                       (frames.STDOUT, 2 ** 32 - 1, b"x" * 70000)]


def test_a_stream_that_is_not_frames_is_refused() -> None:
    with pytest.raises(frames.FrameError):
        frames.Reader().feed(b"\x00\x00\x00\x01k")  # shorter than its own header
    with pytest.raises(frames.FrameError):
        frames.Reader().feed(b"SSH-2.0-OpenSSH")
    with pytest.raises(frames.FrameError):
        frames.loads(b"[1]")


def test_read_frame_ends_at_the_end_of_the_stream() -> None:
    data = bytearray(frames.encode_json(frames.EXIT, 3, {"status": 0}) + b"\x00\x00")

    def read(size: int) -> bytes:
        out = bytes(data[:size])
        del data[:size]
        return out

    assert frames.read_frame(read) == (frames.EXIT, 3, b'{"status": 0}')
    assert frames.read_frame(read) is None  # a frame cut short counts as the end


class Agent:
    """hostagent.py in a local interpreter, as the daemon starts it (shell.BOOTSTRAP)."""

    def __init__(self, silence: float = 30.0) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-u", "-c", shell.BOOTSTRAP],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.send_raw(shell.program_input("hostagent.py", {"silence": silence}))
        hello = self.frame()
        assert hello is not None and hello[:2] == (frames.PONG, 0)
        self.pid = frames.loads(hello[2])["pid"]

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, kind: int, rid: int, payload: bytes = b"") -> None:
        self.send_raw(frames.encode(kind, rid, payload))

    def run(self, rid: int, command: str) -> None:
        self.send(frames.RUN, rid, json.dumps({"command": command}).encode())

    def frame(self) -> Optional[frames.Frame]:
        assert self.proc.stdout is not None
        return frames.read_frame(self.proc.stdout.read)

    def until_exits(self, *rids: int) -> dict[int, dict[str, Any]]:
        """Every request's stdout, stderr and exit, read until each of ``rids`` exited."""
        got: dict[int, dict[str, Any]] = {r: {"out": b"", "err": b"", "ends": 0} for r in rids}
        waiting = set(rids)
        while waiting:
            frame = self.frame()
            assert frame is not None, "the agent ended early"
            kind, rid, payload = frame
            if kind == frames.STDOUT:
                got[rid]["out"] += payload
                got[rid]["ends"] += not payload
            elif kind == frames.STDERR:
                got[rid]["err"] += payload
                got[rid]["ends"] += not payload
            elif kind == frames.EXIT:
                got[rid]["exit"] = frames.loads(payload)
                assert got[rid]["ends"] == 2, "EXIT came before both streams ended"
                waiting.discard(rid)
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agent() -> Iterator[Agent]:
    made = Agent()
    yield made
    made.close()


def wait_for(path: Path, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def test_two_requests_at_once_each_get_their_own_streams(agent: Agent) -> None:
    agent.run(1, "read line; echo got $line; echo one-err >&2; exit 3")
    agent.run(2, "echo two; exit 0")
    got = agent.until_exits(2)
    assert got[2]["out"] == b"two\n" and got[2]["exit"] == {"status": 0}
    agent.send(frames.STDIN, 1, b"hello\n")
    got = agent.until_exits(1)
    assert got[1] == {"out": b"got hello\n", "err": b"one-err\n", "ends": 2,
                      "exit": {"status": 3}}


def test_eof_closes_the_commands_stdin(agent: Agent) -> None:
    agent.run(5, "cat; echo done")
    agent.send(frames.STDIN, 5, b"a" * 200000)
    agent.send(frames.EOF, 5)
    got = agent.until_exits(5)
    assert got[5]["out"] == b"a" * 200000 + b"done\n"


def test_a_command_killed_by_a_signal_reports_what_ssh_reports(agent: Agent) -> None:
    """paramiko gives -1 for a command sshd reports with exit-signal: the same, with the
    signal beside it."""
    agent.run(1, "kill -TERM $$")
    assert agent.until_exits(1)[1]["exit"] == {"status": -1, "signal": 15}


def test_commands_run_in_their_own_session_from_home(agent: Agent) -> None:
    agent.run(1, "ps -o sid= -p $$; echo $$; pwd")
    sid, pid, cwd = agent.until_exits(1)[1]["out"].decode().split()
    assert sid == pid and cwd == str(Path.home())


def test_close_ends_stdin_and_relaying_but_not_the_command(agent: Agent, tmp_path: Path) -> None:
    mark = tmp_path / "saw-eof"
    agent.run(1, f"cat >/dev/null; touch {mark}; sleep 0.2; echo late")
    agent.send(frames.STDIN, 1, b"x\n")
    agent.send(frames.CLOSE, 1)
    assert wait_for(mark), "the command did not see EOF on its stdin"
    time.sleep(0.5)
    agent.send(frames.PING, 9)
    # Nothing more for request 1 (no output, no EXIT): the PING's answer comes next.
    assert agent.frame() == (frames.PONG, 9, b"")


def test_the_agent_exits_on_eof_and_its_children_see_eof(agent: Agent, tmp_path: Path) -> None:
    mark = tmp_path / "saw-eof"
    agent.run(1, f"cat >/dev/null; touch {mark}")
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    assert agent.proc.wait(10) == 0
    assert wait_for(mark)


def test_the_agent_exits_when_nothing_arrives(tmp_path: Path) -> None:
    """A half-open connection: no EOF ever comes, so silence ends the agent."""
    made = Agent(silence=1.0)
    try:
        mark = tmp_path / "saw-eof"
        made.run(1, f"cat >/dev/null; touch {mark}")
        started = time.monotonic()
        assert made.proc.wait(10) == 0
        assert time.monotonic() - started >= 0.8
        assert wait_for(mark)
    finally:
        made.close()


def test_pings_keep_the_agent(tmp_path: Path) -> None:
    made = Agent(silence=1.0)
    try:
        for i in range(6):
            made.send(frames.PING, i)
            assert made.frame() == (frames.PONG, i, b"")
            time.sleep(0.4)
        assert made.proc.poll() is None
    finally:
        made.close()


def test_requests_closed_while_their_output_flows_leave_the_agent_serving(agent: Agent) -> None:
    """A CLOSE read in the same round of select() as its command's output: the output's event
    must not reach the dropped request (its pipes closed, their fd numbers perhaps reused by the
    next request's)."""
    rids = list(range(1, 9))
    for rid in rids:
        agent.run(rid, "yes clusterrun")
    for round_ in range(1, 120):
        flowing: set[int] = set()
        while flowing != set(rids):  # each one's output is on its way
            frame = agent.frame()
            assert frame is not None, "the agent ended: " + _stderr(agent)
            flowing.add(frame[1])
            flowing &= set(rids)
        nxt = [rid + 100 * round_ for rid in range(1, 9)]
        agent.send_raw(b"".join(frames.encode(frames.CLOSE, rid) for rid in rids)
                       + b"".join(frames.encode(frames.RUN, rid, b'{"command": "yes clusterrun"}')
                                  for rid in nxt))
        rids = nxt
    agent.send_raw(b"".join(frames.encode(frames.CLOSE, rid) for rid in rids))
    agent.run(9999, "echo alive")
    out = b""
    while True:
        frame = agent.frame()
        assert frame is not None, "the agent ended: " + _stderr(agent)
        kind, rid, payload = frame
        if rid == 9999 and kind == frames.STDOUT:
            out += payload
        if rid == 9999 and kind == frames.EXIT:
            break
    assert out == b"alive\n"


def _stderr(agent: Agent) -> str:
    agent.close()
    assert agent.proc.stderr is not None
    return agent.proc.stderr.read().decode("utf-8", "replace")[-600:]


def test_descendants_by_children_files_match_the_proc_scan() -> None:
    """The cheap walk (each task's children file) finds what the scan of every process finds:
    grandchildren, a child started by another thread, and no zombie."""
    import os
    import threading

    from clusterrun.remote.hostlib import procs

    assert procs._children_files(), "this kernel keeps no children files: the walk is untested"
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & (sleep 30; true) & wait"],
                            start_new_session=True)
    zombie = subprocess.Popen(["true"])
    box: list[subprocess.Popen[bytes]] = []
    helper = threading.Thread(target=lambda: box.append(subprocess.Popen(["sleep", "30"])))
    helper.start()
    helper.join()
    try:
        deadline = time.monotonic() + 5
        while len(procs.descendants(tree.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        while not procs.zombie(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        walked = sorted(procs.descendants(os.getpid()))
        assert walked == sorted(procs._descendants_by_scan(os.getpid()))
        assert {tree.pid, box[0].pid} <= set(walked) and zombie.pid not in walked
        assert len(procs.descendants(tree.pid)) == 3
    finally:
        os.killpg(tree.pid, 9)
        box[0].kill()
        for each in (tree, box[0], zombie):
            each.wait()


def test_a_child_whose_streams_ended_is_looked_at_at_once_then_less_often() -> None:
    """Its EXIT is the command's end for the client: not held up by the slower tick meant for
    a child that closed its streams and runs on."""
    from clusterrun.remote.tools import hostagent

    agent = hostagent.Agent.__new__(hostagent.Agent)
    agent.reaping = []
    assert agent.tick() == 1.0
    agent.reap_later(object())
    assert agent.tick() == hostagent.REAP_FAST
    agent.reaping_since -= hostagent.REAP_SOON
    assert agent.tick() == hostagent.REAP_TICK
