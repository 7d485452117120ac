"""torch's Flight Recorder in a run's folder on this host (stdlib only, Python 3.6+).

On GPU hosts (plan/environment.py arms it) every NCCL process group keeps its last collectives
in a ring buffer and writes it to ``<rundir>/flight-rank-<R>`` when a collective times out, or
when asked: torch makes a named pipe per rank (``<rundir>/flight-pipe-rank-<R>.pipe``) and dumps
when anything is written to it, while the job runs. ``request`` asks every rank of this host
(``ask``: and says whose dumps came); ``flight`` reads the dumps: per process group the last
collective entered, the last completed (torch's ``pg_status``) and whether one is open;
``behind`` names the ranks whose last collective in a process group is older than their
peers': the ranks that fell behind, where everyone else waits. The stall watchdog asks on its
own (flightwatch.py) and puts the ranks behind first in its report (``lead``).
"""

import json
import os
import time

PIPE = "flight-pipe-rank-"  # + rank + ".pipe", as torch names it
DUMP = "flight-rank-"  # + rank


def request(rundir, wait=5.0):
    """Ask every rank with a pipe here for a dump now; wait up to ``wait`` s for the dumps to be
    written. Returns the ranks asked."""
    return _ask(rundir, wait)[0]


def ask(rundir, wait=5.0):
    """As ``request``, but returns the ranks whose dump was written anew, whole (its size and
    time held between two looks): only those say where the rank is now."""
    return _ask(rundir, wait)[1]


def armed(rundir):
    """Whether a rank here has a Flight Recorder pipe (NCCL's, armed by launch on GPU hosts)."""
    try:
        return any(n.startswith(PIPE) and n.endswith(".pipe") for n in os.listdir(rundir))
    except OSError:
        return False


def _ask(rundir, wait):
    try:
        pipes = sorted(n for n in os.listdir(rundir) if n.startswith(PIPE) and n.endswith(".pipe"))
    except OSError:
        return [], []
    asked = {}
    for name in pipes:
        rank = name[len(PIPE):-len(".pipe")]
        dump = os.path.join(rundir, DUMP + rank)
        before = (_mtime(dump) or (None,))[0]
        try:  # torch holds the read end open while the group lives; none: ENXIO, left out
            fd = os.open(os.path.join(rundir, name), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, b"1\n")
        except OSError:
            continue
        finally:
            os.close(fd)
        asked[rank] = (dump, before)
    # A dump is written in pieces (a few MB): done once it is new and has not changed since
    # the last look.
    last = dict.fromkeys(asked)
    done = set()
    deadline = time.monotonic() + wait
    while len(done) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank, (dump, before) in asked.items():
            now = _mtime(dump)
            if now is not None and now[0] != before and now == last[rank]:
                done.add(rank)
            last[rank] = now
    return _by_rank(asked), _by_rank(done)


def _by_rank(ranks):
    return sorted(ranks, key=lambda r: int(r) if r.isdigit() else r)


def _mtime(path):
    """(modification time, size), or None."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


def flight(rundir, ranks=None):
    """The dumps in the run's folder (``ranks``: only theirs): per rank, the last collective it
    entered, and per process group the last one it entered there (``groups``)."""
    import pickle  # only here: most runs have no dump

    out = []
    try:
        names = sorted(n for n in os.listdir(rundir) if n.startswith(DUMP))
    except OSError:
        return out
    if ranks is not None:
        names = [n for n in names if n[len(DUMP):] in ranks]
    for name in names:
        try:
            with open(os.path.join(rundir, name), "rb") as handle:
                data = handle.read()
            # The run's own ranks wrote it (pickle, or JSON with TORCH_NCCL_USE_JSON).
            dump = json.loads(data) if data[:1] == b"{" else pickle.loads(data)  # noqa: S301
            entries = dump.get("entries") or []
            status = _status(dump.get("pg_status"))
        except Exception:  # a dump being written, or another torch's format: left out
            entries = []
        if entries:
            last = entries[-1]
            out.append({"rank": name[len(DUMP):], "file": name,
                        "collective": str(last.get("profiling_name") or "?"),
                        "seq": last.get("collective_seq_id"), "state": last.get("state"),
                        "entries": len(entries), "last_id": last.get("record_id"),
                        "groups": _groups(entries, status)})
    return out


def _status(found):
    """torch's ``pg_status`` (2.5 and later): {pg_id: (last entered, last completed)}; the
    numbers are text in a JSON dump."""
    out = {}
    for pg, status in (found or {}).items():
        try:
            out[str(pg)] = (int(status["last_enqueued_collective"]),
                            int(status["last_completed_collective"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _groups(entries, status=None):
    """{process group: {"seq", "collective", "state", "completed", "open"}}: the last collective
    entered in each (point-to-point records have their own numbering and are left out), the last
    one completed there (None where the dump has no ``pg_status``), and whether the last one
    entered is open: entered and not completed, so the rank waits for it or will."""
    groups = {}
    for entry in entries:
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group")  # (name, description): ("0", "default_pg")
        if isinstance(group, (list, tuple)) and group:
            name = str(group[-1] or group[0])
        elif entry.get("pg_id") is not None:
            name = "group %s" % entry["pg_id"]
        else:
            name = "the process group"
        seq = entry.get("collective_seq_id")
        if isinstance(seq, int) and seq >= groups.get(name, ({"seq": -1}, None))[0]["seq"]:
            groups[name] = ({"seq": seq, "collective": str(entry.get("profiling_name") or "?"),
                             "state": entry.get("state")}, entry)
    out = {}
    for name, (last, entry) in groups.items():
        counts = (status or {}).get(str(entry.get("pg_id")))
        # torch marks a record retired once its collective completed (NCCL's watchdog, Gloo's
        # work); older dumps say it by the state alone.
        done = entry.get("retired") is True or last["state"] == "completed"
        out[name] = dict(last, completed=counts[1] if counts else None,
                         open=(counts[0] > counts[1] if counts else True) and not done)
    return out


def key(record):
    """What moves while a rank gets through its collectives: its newest record (point-to-point
    ones too) and, per process group, the last collective entered and completed."""
    return (record.get("last_id"), tuple(sorted(
        (name, last["seq"], last.get("completed"))
        for name, last in (record.get("groups") or {}).items())))


def waiting(record):
    """Whether the rank entered a collective that has not completed, in any process group."""
    return any(last.get("open") for last in (record.get("groups") or {}).values())


def behind(records):
    """The ranks that fell behind: in a process group, a rank whose last collective entered is
    older than the newest any rank of it entered. ``records``: ``flight``'s, from every host.
    Returns ``[{"rank", "node", "group", "seq", "collective", "ahead": {"seq", "collective"}}]``."""
    newest = {}
    for record in records:
        for group, last in (record.get("groups") or {}).items():
            if last["seq"] > newest.get(group, {"seq": -1})["seq"]:
                newest[group] = last
    out = []
    for record in records:
        for group, last in sorted((record.get("groups") or {}).items()):
            if last["seq"] < newest[group]["seq"]:
                out.append({"rank": record["rank"], "node": record.get("node"), "group": group,
                            "seq": last["seq"], "collective": last["collective"],
                            "ahead": newest[group]})
    return out


def lead(found, records):
    """The stall report's groups of ranks (remote/shared/stallreport.py) with each rank that fell
    behind its process group (``behind``) first, in a group of its own: the others wait for it,
    whatever the stacks say (a rank waiting for NCCL on a GPU spins in a CUDA synchronisation,
    often in the script's own line). Returns ``(groups, {rank: what behind says of it})``."""
    late = {}
    for entry in behind(records):
        if str(entry["rank"]).isdigit():
            late.setdefault(int(entry["rank"]), entry)
    if not late:
        return found, late
    first = [[r] for members in found for r in members if r["rank"] in late]
    rest = [[r for r in members if r["rank"] not in late] for members in found]
    return first + [members for members in rest if members], late


def said(late):
    """One of ``behind``'s findings in words."""
    ahead = late["ahead"]
    return ("flight recorder: rank %s is behind in %s: it last entered %s #%s, the others got "
            "to %s #%s" % (late["rank"], late["group"], late["collective"], late["seq"],
                           ahead["collective"], ahead["seq"]))
