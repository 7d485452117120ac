"""`stacks --profile`: how much of a window each rank spends waiting in torch.distributed
(stdlib only, Python 3.6+).

One ``py-spy record --nonblocking --idle`` per rank, all at once, for the window: py-spy reads
each rank's stack ``rate`` times a second without pausing it (``--idle`` keeps the samples of a
thread blocked in a collective, which py-spy would otherwise drop as idle). A sample of the
main thread counts as waiting when one of its frames is a torch.distributed collective or
barrier (pystack.COLLECTIVES). The share of waiting samples is the rank's wait share: in a
synchronous job the slowest rank waits least, while the others wait for it.
"""

import contextlib
import os
import subprocess
import tempfile
import threading

from clusterrun.remote import pystack

RATE = 50  # samples a second: py-spy's cost stays small, and 10 s give 500 samples per rank


def is_waiting(frames):
    """Whether a sample's frames (``name (file:line)`` each) show a collective call."""
    for frame in frames:
        name, _, where = frame.rpartition(" (")
        if (name.rsplit(".", 1)[-1] in pystack.COLLECTIVES and "torch/distributed" in where):
            return True
    return False


def count(raw):
    """(samples, waiting) of the main thread, from py-spy's raw output (``--threads``: each
    line ``thread (TID): NAME;frame;frame COUNT``)."""
    lines = []
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            lines.append((stack.split(";"), int(number)))
    main = [(f, n) for f, n in lines if f[0].endswith(": MainThread")] or lines
    samples = sum(n for _, n in main)
    waiting = sum(n for f, n in main if is_waiting(f[1:]))
    return samples, waiting


def record(pyspy, pid, seconds, rate=RATE):
    """One rank through the window: {"samples", "waiting", "error"}."""
    fd, path = tempfile.mkstemp(prefix="clusterrun-profile-", suffix=".txt")
    os.close(fd)
    try:
        proc = subprocess.run(
            [pyspy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
             "--rate", str(int(rate)), "--format", "raw", "--output", path, "--nonblocking",
             "--idle", "--threads"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            timeout=seconds + pystack.PYSPY_TIMEOUT, check=False)
        with open(path) as handle:
            raw = handle.read()
    except subprocess.TimeoutExpired:
        return {"samples": 0, "waiting": 0, "error": "py-spy record gave no answer"}
    except OSError as exc:
        return {"samples": 0, "waiting": 0, "error": "cannot run py-spy: %s" % exc}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    samples, waiting = count(raw)
    error = None
    if not samples:
        said = proc.stderr.decode("utf-8", "replace").strip().splitlines()
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
