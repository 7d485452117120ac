"""`stacks --profile`: how much of a window each rank spends waiting for its peers (stdlib only,
Python 3.6+).

Two ``py-spy record --nonblocking`` per rank, all at once, for the window: one with ``--idle``
(every sample of every thread, blocked or not) and one without (the samples of running threads
only). py-spy reads each rank's stack ``rate`` times a second without pausing it. Per stack of
the main thread, the first count less the second is how often it sat idle there. A sample counts
as waiting for the peers (stackrule.peer_wait) when a torch.distributed collective or barrier is
on its stack (running or not: NCCL's waiters may spin), or when it sat idle with its innermost
frame in the backward pass (DDP's reducer all-reduces the gradients from autograd's hooks) or in
torch.distributed (a work handle's wait). The share of waiting samples is the rank's wait share:
in a synchronous job the slowest rank waits least, while the others wait for it.
"""

import contextlib
import os
import subprocess
import tempfile
import threading

from clusterrun.remote.hostlib import pystack
from clusterrun.remote.shared import stackrule

RATE = 50  # samples a second: py-spy's cost stays small, and 10 s give 500 samples per rank


def parse_frame(text):
    """``name (file:line)`` as py-spy's raw format writes a frame -> pystack's frame dict."""
    name, _, where = text.rpartition(" (")
    where = where.rstrip(")")
    path, _, line = where.rpartition(":")
    return {"function": name or text, "file": path or where,
            "line": int(line) if line.isdigit() else 0}


def main_stacks(raw):
    """{stack: samples} of the main thread, from py-spy's raw output (``--threads``: each line
    ``thread (TID): NAME;frame;frame COUNT``); a stack is its frames' text, outermost first."""
    lines = []
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            lines.append((stack.split(";"), int(number)))
    main = [(f, n) for f, n in lines if f[0].endswith(": MainThread")] or lines
    out = {}
    for frames, number in main:
        key = tuple(frames[1:])
        out[key] = out.get(key, 0) + number
    return out


def count(every, running=None):
    """(samples, waiting) of the main thread: ``every`` is the --idle record's raw output,
    ``running`` the other's (None: no idle samples are told apart, collectives only)."""
    stacks = main_stacks(every)
    active = main_stacks(running) if running is not None else None
    samples = waiting = 0
    for key, number in stacks.items():
        samples += number
        frames = [parse_frame(x) for x in key]
        if stackrule.peer_wait(frames):  # a collective on the stack, running or not
            waiting += number
        elif active is not None and stackrule.peer_wait(frames, False):
            waiting += max(0, number - active.get(key, 0))  # its idle samples
    return samples, waiting


def _spawn(pyspy, pid, seconds, rate, idle):
    fd, path = tempfile.mkstemp(prefix="clusterrun-profile-", suffix=".txt")
    os.close(fd)
    argv = [pyspy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
            "--rate", str(int(rate)), "--format", "raw", "--output", path, "--nonblocking",
            "--threads"] + (["--idle"] if idle else [])
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
    except OSError:
        os.unlink(path)
        raise
    return proc, path


def _finish(proc, path, timeout):
    """(raw output or None, stderr); the file is removed."""
    try:
        try:
            _out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None, b""
        with open(path) as handle:
            return handle.read(), err
    except OSError:
        return None, b""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def record(pyspy, pid, seconds, rate=RATE):
    """One rank through the window: {"samples", "waiting", "error"}."""
    try:
        every = _spawn(pyspy, pid, seconds, rate, True)
    except OSError as exc:
        return {"samples": 0, "waiting": 0, "error": "cannot run py-spy: %s" % exc}
    try:
        running = _spawn(pyspy, pid, seconds, rate, False)
    except OSError:
        running = None
    raw, err = _finish(every[0], every[1], seconds + pystack.PYSPY_TIMEOUT)
    active = _finish(running[0], running[1], pystack.PYSPY_TIMEOUT)[0] if running else None
    if raw is None:
        return {"samples": 0, "waiting": 0, "error": "py-spy record gave no answer"}
    samples, waiting = count(raw, active)
    error = None
    if not samples:
        said = err.decode("utf-8", "replace").strip().splitlines()
        error = "py-spy record: %s" % (said[0] if said else "no samples")
    return {"samples": samples, "waiting": waiting, "error": error}


def record_all(pyspy, ranks, seconds, rate=RATE):
    """Every rank of ``ranks`` ({rank: pid}) through the same window: {rank: record()}."""
    out = {}

    def one(rank, pid):
        out[rank] = record(pyspy, pid, seconds, rate)

    workers = [threading.Thread(target=one, args=item) for item in sorted(ranks.items())]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return out
