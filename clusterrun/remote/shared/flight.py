"""torch's Flight Recorder in a run's folder on a host, read back (stdlib only, Python 3.6+).

On GPU hosts (plan/environment.py arms it) every NCCL process group keeps its last collectives
in a ring buffer and writes it to ``<rundir>/flight-rank-<R>`` when a collective times out, or
when asked through the rank's pipe (remote/hostlib/flightpipe.py, on the host). ``flight``
reads the dumps: per process group the last collective entered, the last completed (torch's
``pg_status``) and whether one is open; ``behind`` names the ranks whose last collective in a
process group is older than their peers': the ranks that fell behind, where everyone else
waits. The stall watchdog asks on its own (flightwatch.py) and puts the ranks behind first in
its report (``lead``); the controller's `stacks` reads the same records.
"""

import json
import os
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

PIPE = "flight-pipe-rank-"  # + rank + ".pipe", as torch names it
DUMP = "flight-rank-"  # + rank

# ``flight``'s record of one rank's dump (JSON on the wire: stackdump.py answers with them), and
# its last collective in one process group: {"seq", "collective", "state", "completed", "open"}.
Record = Dict[str, Any]
Last = Dict[str, Any]


def flight(rundir: str, ranks: Optional[Collection[str]] = None) -> List[Record]:
    """The dumps in the run's folder (``ranks``: only theirs): per rank, the last collective it
    entered, and per process group the last one it entered there (``groups``)."""
    import pickle  # only here: most runs have no dump

    out: List[Record] = []
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


def _status(found: Optional[Mapping[Any, Any]]) -> Dict[str, Tuple[int, int]]:
    """torch's ``pg_status`` (2.5 and later): {pg_id: (last entered, last completed)}; the
    numbers are text in a JSON dump."""
    out: Dict[str, Tuple[int, int]] = {}
    for pg, status in (found or {}).items():
        try:
            out[str(pg)] = (int(status["last_enqueued_collective"]),
                            int(status["last_completed_collective"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _groups(entries: Sequence[Dict[str, Any]],
            status: Optional[Mapping[str, Tuple[int, int]]] = None) -> Dict[str, Last]:
    """{process group: {"seq", "collective", "state", "completed", "open"}}: the last collective
    entered in each (point-to-point records have their own numbering and are left out), the last
    one completed there (None where the dump has no ``pg_status``), and whether the last one
    entered is open: entered and not completed, so the rank waits for it or will."""
    groups: Dict[str, Tuple[Last, Dict[str, Any]]] = {}
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
    out: Dict[str, Last] = {}
    for name, (last, entry) in groups.items():
        counts = (status or {}).get(str(entry.get("pg_id")))
        # torch marks a record retired once its collective completed (NCCL's watchdog, Gloo's
        # work); older dumps say it by the state alone.
        done = entry.get("retired") is True or last["state"] == "completed"
        out[name] = dict(last, completed=counts[1] if counts else None,
                         open=(counts[0] > counts[1] if counts else True) and not done)
    return out


def key(record: Record) -> Tuple[Any, Tuple[Tuple[str, Any, Any], ...]]:
    """What moves while a rank gets through its collectives: its newest record (point-to-point
    ones too) and, per process group, the last collective entered and completed."""
    return (record.get("last_id"), tuple(sorted(
        (name, last["seq"], last.get("completed"))
        for name, last in (record.get("groups") or {}).items())))


def waiting(record: Record) -> bool:
    """Whether the rank entered a collective that has not completed, in any process group."""
    return any(last.get("open") for last in (record.get("groups") or {}).values())


def behind(records: Sequence[Record]) -> List[Dict[str, Any]]:
    """The ranks that fell behind: in a process group, a rank whose last collective entered is
    older than the newest any rank of it entered. ``records``: ``flight``'s, from every host.
    Returns ``[{"rank", "node", "group", "seq", "collective", "ahead": {"seq", "collective"}}]``."""
    newest: Dict[str, Last] = {}
    for record in records:
        for group, last in (record.get("groups") or {}).items():
            if last["seq"] > newest.get(group, {"seq": -1})["seq"]:
                newest[group] = last
    out: List[Dict[str, Any]] = []
    for record in records:
        for group, last in sorted((record.get("groups") or {}).items()):
            if last["seq"] < newest[group]["seq"]:
                out.append({"rank": record["rank"], "node": record.get("node"), "group": group,
                            "seq": last["seq"], "collective": last["collective"],
                            "ahead": newest[group]})
    return out


def lead(found: List[List[Dict[str, Any]]], records: Sequence[Record],
         ) -> Tuple[List[List[Dict[str, Any]]], Dict[int, Dict[str, Any]]]:
    """The stall report's groups of ranks (remote/shared/stallreport.py) with each rank that fell
    behind its process group (``behind``) first, in a group of its own: the others wait for it,
    whatever the stacks say (a rank waiting for NCCL on a GPU spins in a CUDA synchronisation,
    often in the script's own line). Returns ``(groups, {rank: what behind says of it})``."""
    late: Dict[int, Dict[str, Any]] = {}
    for entry in behind(records):
        if str(entry["rank"]).isdigit():
            late.setdefault(int(entry["rank"]), entry)
    if not late:
        return found, late
    first = [[r] for members in found for r in members if r["rank"] in late]
    rest = [[r for r in members if r["rank"] not in late] for members in found]
    return first + [members for members in rest if members], late


def said(late: Mapping[str, Any]) -> str:
    """One of ``behind``'s findings in words."""
    ahead = late["ahead"]
    return ("flight recorder: rank %s is behind in %s: it last entered %s #%s, the others got "
            "to %s #%s" % (late["rank"], late["group"], late["collective"], late["seq"],
                           ahead["collective"], ahead["seq"]))
