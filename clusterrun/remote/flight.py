"""torch's Flight Recorder in a run's folder on this host (stdlib only, Python 3.6+).

On GPU hosts (plan/environment.py arms it) every NCCL process group keeps its last collectives
in a ring buffer and writes it to ``<rundir>/flight-rank-<R>`` when a collective times out, or
when asked: torch makes a named pipe per rank (``<rundir>/flight-pipe-rank-<R>.pipe``) and dumps
when anything is written to it, while the job runs. ``request`` asks every rank of this host;
``flight`` reads the dumps; ``behind`` names the ranks whose last collective in a process group
is older than their peers': the ranks that fell behind, where everyone else waits.
"""

import json
import os
import time

PIPE = "flight-pipe-rank-"  # + rank + ".pipe", as torch names it
DUMP = "flight-rank-"  # + rank


def request(rundir, wait=5.0):
    """Ask every rank with a pipe here for a dump now; wait up to ``wait`` s for the dumps to be
    written. Returns the ranks asked."""
    try:
        pipes = sorted(n for n in os.listdir(rundir) if n.startswith(PIPE) and n.endswith(".pipe"))
    except OSError:
        return []
    asked = {}
    for name in pipes:
        rank = name[len(PIPE):-len(".pipe")]
        dump = os.path.join(rundir, DUMP + rank)
        before = _mtime(dump)
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
    deadline = time.monotonic() + wait
    while asked and time.monotonic() < deadline:
        if all(_mtime(d) != b for d, b in asked.values()):
            break
        time.sleep(0.1)
    return sorted(asked, key=lambda r: int(r) if r.isdigit() else r)


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def flight(rundir):
    """The dumps in the run's folder: per rank, the last collective it entered, and per process
    group the last one it entered there (``groups``)."""
    import pickle  # only here: most runs have no dump

    out = []
    try:
        names = sorted(n for n in os.listdir(rundir) if n.startswith(DUMP))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(rundir, name), "rb") as handle:
                data = handle.read()
            # The run's own ranks wrote it (pickle, or JSON with TORCH_NCCL_USE_JSON).
            dump = json.loads(data) if data[:1] == b"{" else pickle.loads(data)  # noqa: S301
            entries = dump.get("entries") or []
        except Exception:  # a dump being written, or another torch's format: left out
            entries = []
        if entries:
            last = entries[-1]
            out.append({"rank": name[len(DUMP):], "file": name,
                        "collective": str(last.get("profiling_name") or "?"),
                        "seq": last.get("collective_seq_id"), "state": last.get("state"),
                        "entries": len(entries), "groups": _groups(entries)})
    return out


def _groups(entries):
    """{process group: {"seq", "collective", "state"}} of the last collective entered in each
    (point-to-point records have their own numbering and are left out)."""
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
        if isinstance(seq, int) and seq >= groups.get(name, {}).get("seq", -1):
            groups[name] = {"seq": seq, "collective": str(entry.get("profiling_name") or "?"),
                            "state": entry.get("state")}
    return groups


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
