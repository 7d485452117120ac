"""The job's own cgroup (cgroup v2), where the host lets this user create one (stdlib only,
Python 3.6+).

A process stays in its cgroup whatever it does: setsid, a double fork, a daemon re-parented
away. So the supervisor, which is also the job's child subreaper (procs.Tree), ends everything
in the cgroup when the run ends, and `clusterrun stop` can end it later even if the supervisor
itself was killed. Where no cgroup can be created (no cgroup v2, or a non-root user whose
session cgroup is not delegated), the subreaper alone tracks the job: a process then escapes
only if the supervisor itself dies, and the controller says so at launch.
"""

import contextlib
import os
import re
import signal
import time

MOUNTINFO = "/proc/self/mountinfo"
OWN = "/proc/self/cgroup"


def mount_point(mountinfo=MOUNTINFO):
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on a
    hybrid host), or None."""
    try:
        with open(mountinfo) as handle:
            for line in handle:
                fields = line.split()
                if "-" in fields:
                    sep = fields.index("-")
                    if sep + 1 < len(fields) and fields[sep + 1] == "cgroup2":
                        return fields[4]
    except OSError:
        pass
    return None


def own_path(own=OWN):
    """This process's cgroup v2 path ("0::/a/b" in /proc/self/cgroup), or None."""
    try:
        with open(own) as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def name_for(*parts):
    """A cgroup name from the run id, node and attempt: no '/' or newline, bounded length."""
    return ("clusterrun-" + re.sub(r"[^A-Za-z0-9_.-]", "_", ".".join(parts)))[:200]


def create(name, mountinfo=MOUNTINFO, own=OWN):
    """A new cgroup ``name`` beside nothing else, below this process's own: (path, None), or
    (None, why not)."""
    mount = mount_point(mountinfo)
    if mount is None:
        return None, "no cgroup v2 file system is mounted"
    mine = own_path(own)
    if mine is None:
        return None, "this process is in no cgroup v2"
    parent = os.path.join(mount, mine.lstrip("/"))
    # Moving a process in needs write access to cgroup.procs in the new cgroup and in the
    # common ancestor, which is the one we are in.
    if not os.access(os.path.join(parent, "cgroup.procs"), os.W_OK):
        return None, "cannot move processes within %s (not delegated to this user)" % parent
    path = os.path.join(parent, name)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        return None, "cannot create a cgroup under %s: %s" % (parent, exc.strerror)
    return path, None


def for_job(env, node):
    """The cgroup of one node's part of a run (its attempt included): (path, None), or
    (None, why there is none). ``CLUSTERRUN_CGROUP=0`` in the job's environment turns it off."""
    if env.get("CLUSTERRUN_CGROUP") == "0":
        return None, "CLUSTERRUN_CGROUP=0"
    return create(name_for(env.get("CLUSTERRUN_RUN_ID", str(os.getpid())), node,
                           "a" + env.get("CLUSTERRUN_RESTART_COUNT", "0")))


def enter(path):
    """Move the calling process into ``path`` (in a forked child, before it execs: nothing it
    starts can be outside). False when the kernel refused."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as handle:
            handle.write("%d\n" % os.getpid())
        return True
    except OSError:
        return False


def members(path):
    """The live processes in the cgroup (and any below it)."""
    found = []
    for folder, _dirs, _files in os.walk(path):
        try:
            with open(os.path.join(folder, "cgroup.procs")) as handle:
                found.extend(int(line) for line in handle if line.strip())
        except (OSError, ValueError):
            continue
    return found


def kill(path):
    """SIGKILL to everything in the cgroup: cgroup.kill where the kernel has it (5.14+), which
    also catches a process forking at that moment; otherwise each member."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as handle:
            handle.write("1\n")
        return
    except OSError:
        pass
    for pid in members(path):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def end(path, seconds, between=None):
    """Kill everything in the cgroup until it is empty (``between()`` runs while waiting: the
    supervisor reaps its children there) or ``seconds`` pass, then remove it."""
    deadline = time.monotonic() + seconds
    while True:
        kill(path)
        if between is not None:
            between()
        if not members(path) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    remove(path)


def remove(path):
    """Remove the (empty) cgroup; an error leaves it for the host's owner to see."""
    for folder, _dirs, _files in sorted(os.walk(path), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
