"""A run's rank processes on this host and their Python stacks (stdlib only, Python 3.6+).

Shared by the `stacks` program (remote/tools/stackdump.py) and the supervisor's stall watch
(remote/shared/stallrule.py). A rank is the process rank.sh starts: its parent runs
``/bin/sh <rundir>/rank.sh``, so a rank's own children (data loader workers) are never taken
for ranks, and another run's ranks (another rundir) never match. Stacks come from py-spy
(``dump --nonblocking``: memory is read while the rank runs, it is never paused or stopped).
"""

import json
import os
import subprocess
import threading
import time

from clusterrun.remote.hostlib import procs
from clusterrun.remote.shared import layout, userframe

PYSPY_TIMEOUT = 8.0
NO_PYSPY = ("no py-spy on this host (install it in the host's Python environment: pip install "
            "py-spy; or run `clusterrun stacks` once, which ships the controller's)")


def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def _rank_of(pid):
    """RANK from the process's environment (readable by its own user)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            for item in handle.read().split(b"\0"):
                if item.startswith(b"RANK="):
                    return int(item[5:])
    except (OSError, ValueError):
        pass
    return None


def find_ranks(rundir, roots):
    """``{rank: pid}`` of the ranks below ``roots`` (torchrun's or the launcher's pid, and the
    job's cgroup members)."""
    wrapper = os.path.join(rundir, layout.RANK_SH).encode()
    pids = set()
    for root in roots:
        pids.add(root)
        pids.update(procs.descendants(root))
    found = {}
    for pid in sorted(pids):
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        parent = _cmdline(int(stat[1]))
        if len(parent) < 2 or parent[1] != wrapper:
            continue
        own = _cmdline(pid)
        if len(own) > 1 and own[1] in (wrapper, b"-c"):
            continue  # rank.sh itself, or its shell that has not exec'd the rank yet
        rank = _rank_of(pid)
        if rank is not None and rank not in found:
            found[rank] = pid
    return found


def cpu_ticks(pid):
    """User + system CPU time of a process (all its threads), in clock ticks; None if gone."""
    stat = _stat(pid)
    if stat is None:
        return None
    return int(stat[11]) + int(stat[12])


def io_bytes(pid):
    """The bytes a process has written through write calls and moved to or from storage,
    summed (/proc/PID/io, its threads included); None if gone or not readable. ``wchar`` grows
    when a write call returns; ``read_bytes``/``write_bytes`` grow while one runs, as pages are
    read in or dirtied, so a single large write to a slow filesystem (a checkpoint on NFS,
    throttled to the writeback rate) shows as it goes. ``rchar`` is left out: it grows with any
    read served from the page cache, a pipe or a socket, and a job polling a small file for a
    signal that never comes is waiting, not making progress (a slow read from NFS, which
    read_bytes may not count, sits in uninterruptible sleep: in_io_wait)."""
    try:
        with open("/proc/%d/io" % pid) as handle:
            fields = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
    except (OSError, ValueError):
        return None
    try:
        return sum(int(fields.get(k, "0")) for k in ("wchar", "read_bytes", "write_bytes"))
    except ValueError:
        return None


def in_io_wait(pid):
    """Whether any thread of the process sits in uninterruptible sleep (state D): inside the
    kernel waiting on I/O, such as an fsync or close of a checkpoint on a slow filesystem (an
    async checkpoint writes from a thread of its own)."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return False
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "D":
                    return True
        except (OSError, IndexError):
            continue
    return False


def proc_state(pid):
    stat = _stat(pid)
    return stat[0] if stat else None


def last_line(rundir, rank, limit=4096):
    """The last non-empty line the rank wrote (its log on this host), at most 300 characters."""
    try:
        with open(os.path.join(rundir, layout.rank_log(rank)), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            data = handle.read()
    except OSError:
        return ""
    for line in reversed(data.splitlines()):
        text = line.decode("utf-8", "replace").strip()
        if text:
            return text[:300]
    return ""


def ptrace_scope():
    """Yama's kernel.yama.ptrace_scope, or None where the kernel has no Yama."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def host_pyspy(python):
    """py-spy installed on this host: next to its Python (a venv's bin/), or on PATH."""
    candidates = [os.path.join(os.path.dirname(python), "py-spy")] if python else []
    candidates += [os.path.join(d, "py-spy") for d in os.environ.get("PATH", "").split(":") if d]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _frames(raw):
    """py-spy's frames (innermost first) as a traceback's: outermost first."""
    return [{"function": f.get("name") or "?", "file": f.get("filename") or "?",
             "line": int(f.get("line") or 0)} for f in reversed(raw or [])]


def dump(pyspy, pid, timeout=PYSPY_TIMEOUT, tries=3):
    """``(threads, error)`` for one process: every thread's name and frames, outermost first.
    Reading a running process's memory can race with it (a stack changing under py-spy): a
    failed read is tried again."""
    for _ in range(tries):
        threads, error = _dump_once(pyspy, pid, timeout)
        if error is None or "no answer" in error or "cannot run" in error:
            break
        time.sleep(0.1)
    return threads, error


def _dump_once(pyspy, pid, timeout):
    try:
        proc = subprocess.Popen([pyspy, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
    except OSError as exc:
        return [], "cannot run py-spy: %s" % exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return [], "py-spy gave no answer within %g s" % timeout
    if proc.returncode != 0:
        return [], "py-spy: %s" % _why(err.decode("utf-8", "replace"), proc.returncode)
    try:
        traces = json.loads(out.decode("utf-8", "replace"))
    except ValueError:
        return [], "py-spy answered no JSON"
    # Without the interpreter's symbols py-spy cannot name threads: the process's own
    # thread (its id is the pid) is the main one.
    # active: py-spy's own judgement of the thread, running or idle (blocked in a wait).
    threads = [{"name": t.get("thread_name") or ("MainThread" if t.get("os_thread_id") == pid
                                                 else "thread %s" % t.get("os_thread_id")),
                "frames": _frames(t.get("frames")), "active": t.get("active")}
               for t in traces if isinstance(t, dict)]
    return threads, None


def _why(text, code):
    """py-spy's error and its innermost cause, without the Rust backtrace."""
    lines = [x.strip() for x in text.split("Stack backtrace:")[0].splitlines() if x.strip()]
    causes = [x.split(":", 1)[-1].strip() for x in lines if x[:1].isdigit()]
    first = lines[0] if lines else "exit status %d" % code
    return first + (" (%s)" % causes[-1] if causes else "")


def code_dir(pid):
    """The directory of the script a rank runs (its first ``*.py`` argument), or None."""
    for arg in _cmdline(pid)[1:]:
        text = arg.decode("utf-8", "replace")
        if text.endswith(".py") and not text.startswith("-"):
            if not os.path.isabs(text):
                try:
                    text = os.path.join(os.readlink("/proc/%d/cwd" % pid), text)
                except OSError:
                    return None
            return os.path.dirname(os.path.normpath(text))
    return None


def children(pyspy, pid, code, limit=8):
    """The rank's Python child processes (DataLoader workers, oldest first) and their stacks;
    a child py-spy cannot read (not Python) is left out."""
    found = sorted(procs.descendants(pid), key=lambda p: (procs.start_time(p) or 0, p))
    out = []
    workers = 0
    for child in found[:limit]:
        threads, error = dump(pyspy, child, tries=1)
        if error:
            continue
        main = userframe.main_thread(threads) or {}
        frames = main.get("frames") or []
        loop = [i for i, f in enumerate(frames) if "torch/utils/data/_utils/worker.py" in f["file"]]
        if loop:
            label = "DataLoader worker %d" % workers
            workers += 1
        else:
            label = "child process"
        # A forked worker's stack still holds its parent's frames at the fork, outside the
        # worker's loop: only the frames the loop called are the worker's own.
        user = userframe.user_frame(frames, code, loop[0] if loop else 0)
        out.append({"pid": child, "label": label, "state": proc_state(child),
                    "threads": threads, "user": user})
    return out


def dump_all(pyspy, ranks, rundir):
    """Every rank of ``ranks`` ({rank: pid}) at once: a list of per-rank dicts, each with its
    child processes (DataLoader workers) and the line a user can act on (``where``)."""
    out = {}

    def one(rank, pid):
        threads, error = dump(pyspy, pid) if pyspy else ([], NO_PYSPY)
        entry = {"rank": rank, "pid": pid, "state": proc_state(pid), "threads": threads,
                 "error": error, "last_line": last_line(rundir, rank)}
        if not error:
            code = code_dir(pid)
            main = userframe.main_thread(threads) or {}
            entry["user"] = userframe.user_frame(main.get("frames") or [], code)
            entry["children"] = children(pyspy, pid, code)
            entry["where"] = userframe.where(entry)
            if entry["user"]:
                entry["at"] = userframe.at(entry["user"])
        out[rank] = entry

    workers = [threading.Thread(target=one, args=item) for item in sorted(ranks.items())]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [out[rank] for rank in sorted(out)]
