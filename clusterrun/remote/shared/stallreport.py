"""The stall report: who is the odd rank out, and the words (stdlib only, Python 3.6+).

One rule and one builder, used by the run's one stall decider, the master's supervisor
(remote/node/stallhub.py), with the dicts its peers sent over the gang (detached) or the ones an
attached run's controller collected (clusterrun/stacks/stallview.py); `stacks` groups alike. A
rank is the dict remote/hostlib/pystack.py ``dump_all`` gives (``rank``, ``pid``, ``threads``,
``state``,
``error``, ``last_line``, ``where``) plus its ``node``.

The rule: ranks with the same main-thread stack (every frame, and whether it is stopped) form a
group; ranks outside any collective come first (the likelier cause), then the smallest groups,
then the lowest rank. Every group but the last is odd; a single group is odd only when it is a
single rank. A rank whose stack could not be read is no odd one out (not seeing it names no
host), and when no rank's stack could be read the report says what could not be seen and names
no rank and no host (``blind``). A rank that fell behind its process group by torch's Flight
Recorder (NCCL on GPUs: remote/shared/flight.py ``lead``) comes first, odd, in a group of its own.
``stop`` picks, for both, the host a stopped stall fails.
"""

import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from clusterrun.remote.shared import flight, stackrule, userframe
from clusterrun.remote.shared.userframe import Frame

# A rank as the report reads it (pystack.py's entry and its ``node``), and the record it keeps.
Rank = Dict[str, Any]
Record = Dict[str, Any]

# The words of a blind report's first line, and so of its stop's detail: wire.RootCause reads
# them to record a stopped stall that blames no host.
BLIND = "no rank's stack could be read, so no rank or host can be named as the cause"
# How a stop's detail starts when a host's links failed the re-test (linkrule.py), and the
# report's line that names such a host (``LINKS_ROOT % host``).
LINKS_FAIL = "its links fail: "
LINKS_ROOT = "stall: root cause: %s's links fail: "
# How the decider keeps a report's lines, and the run moving again, in the master's node.log,
# so that `logs` shows them with the run's other lines (``noted``). An attached run's console,
# on which the controller prints the report itself, leaves these lines out (``is_note``).
NOTE = "clusterrun: %s\n"
MOVES_AGAIN = "the run moves again: running"


def noted(lines: Sequence[str]) -> str:
    return "".join(NOTE % line for line in lines)


# The two kinds of line ``noted`` writes, as node.log holds them (bytes, no newline): made once,
# since the console asks of every line of node.log.
_STALL_NOTE = (NOTE % "stall: ")[:-1].encode()
_MOVES_NOTE = (NOTE % MOVES_AGAIN)[:-1].encode()


def is_note(line: bytes) -> bool:
    """Whether a line of node.log is one the decider wrote there (``noted``)."""
    return line.startswith(_STALL_NOTE) or line == _MOVES_NOTE


def spans(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: List[List[int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in out)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def fold_hosts(names: Iterable[str]) -> str:
    """node1,node2,node3,gpu07 -> "gpu07,node[1-3]": names that differ in their last number
    only are folded, zero padding kept, as ClusterShell's NodeSet folds such names (the
    controller folds with NodeSet itself; the hosts have only the standard library)."""
    by_prefix: Dict[str, List[str]] = {}
    plain: List[str] = []
    for name in sorted(set(names)):
        found = _NUMBERED.match(name)
        if found:
            by_prefix.setdefault(found.group(1), []).append(found.group(2))
        else:
            plain.append(name)
    parts = [(name, name) for name in plain]
    for prefix, digits in by_prefix.items():
        runs: List[List[str]] = []  # [first, last] as text; a run keeps one width (01-03, not 1-03)
        for text in sorted(digits, key=lambda d: (int(d), d)):
            last = runs[-1][1] if runs else None
            if last is not None and int(text) == int(last) + 1 and (
                    len(text) == len(last) or str(int(last)) == last):  # 9-10, 09-10
                runs[-1][1] = text
            else:
                runs.append([text, text])
        inner = ",".join(a if a == b else "%s-%s" % (a, b) for a, b in runs)
        folded = prefix + ("[%s]" % inner if len(digits) > 1 else inner)
        parts.append((prefix, folded))
    return ",".join(text for _key, text in sorted(parts))


def main_stack(rank: Rank) -> Tuple[List[Frame], Optional[bool]]:
    """The rank's main thread's frames (outermost first) and py-spy's running flag."""
    main = userframe.main_thread(rank.get("threads") or []) or {}
    return main.get("frames") or [], main.get("active")


def waits_in(rank: Rank) -> Optional[str]:
    """Where the rank's main thread waits for its peers (remote/hostlib/pystack.py), or None."""
    return stackrule.peer_wait(*main_stack(rank))


def innermost(rank: Rank) -> str:
    """The frame a rank is in: ``sleep (job.py:3)``."""
    if rank.get("error"):
        return str(rank["error"])
    frames = main_stack(rank)[0]
    if not frames:
        return "no Python frames"
    inner = frames[-1]
    return "%s (%s:%d)" % (inner["function"], inner["file"].rsplit("/", 1)[-1], inner["line"])


def groups(ranks: Iterable[Rank]) -> List[List[Rank]]:
    """The ranks whose stacks were read, grouped by identical stack, odd ones out first."""
    found: Dict[Tuple[bool, Tuple[Tuple[str, str, int], ...]], List[Rank]] = {}
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        frames = main_stack(rank)[0]
        key = (rank.get("state") == "T",
               tuple((f["function"], f["file"], f["line"]) for f in frames))
        found.setdefault(key, []).append(rank)
    return sorted(found.values(), key=lambda g: (waits_in(g[0]) is not None, len(g),
                                                 g[0]["rank"]))


def build(ranks: Sequence[Rank], timeout: float, problems: Optional[Mapping[str, str]] = None,
          fold_nodes: Callable[[List[str]], str] = fold_hosts,
          fold_ranks: Callable[[List[int]], str] = spans, *,
          records: Iterable[flight.Record] = ()) -> Tuple[List[str], Record]:
    """``(lines, record)``: the report, odd ranks out first, then the waiting group, then what
    could not be seen; the record has ``odd`` (rank, node, pid, frame, last line, stopped,
    where), ``waiting`` (ranks, in) and ``blind``. ``problems``: {host: why it gave no stacks}.
    A rank that fell behind its process group by torch's Flight Recorder (``records``, or a
    rank's own ``flight``: remote/shared/flight.py) is an odd one out first, whatever its stack."""
    problems = problems or {}
    seen = [r for r in ranks if not r.get("error")]
    if not seen:
        return blind(ranks, timeout, problems), {"timeout": timeout, "odd": [],
                                                 "waiting": None, "blind": True}
    found = groups(seen)
    out = ["stall: no rank made progress for %s s; %d rank%s, %d different stack%s" % (
        "%g" % timeout, len(ranks), "" if len(ranks) == 1 else "s", len(found),
        "" if len(found) == 1 else "s")]
    found, late = flight.lead(found, list(records) + [r["flight"] for r in ranks
                                                      if r.get("flight")])
    odd: List[Dict[str, Any]] = []
    waiting: Optional[Dict[str, Any]] = None
    for index, members in enumerate(found):
        wait = waits_in(members[0])
        # Outside a collective: the user's own line where there is one (a DataLoader's wait
        # is a stdlib selector's frame, which nobody can act on), else the innermost frame.
        where = "the collective %s" % wait if wait else (members[0].get("at")
                                                           or innermost(members[0]))
        if (index < len(found) - 1 or (len(found) == 1 and len(members) == 1)
                or members[0]["rank"] in late):
            for rank in members:
                stopped = rank.get("state") == "T"
                out.append("stall: odd one out: rank %d on %s (pid %d)%s in %s; last line: %r"
                           % (rank["rank"], rank["node"], rank["pid"],
                              " STOPPED (SIGSTOP)" if stopped else "", where,
                              rank.get("last_line") or ""))
                if rank.get("where"):  # its own line, and its DataLoader workers'
                    out.append("stall:   %s" % rank["where"])
                if rank["rank"] in late:
                    out.append("stall:   %s" % flight.said(late[rank["rank"]]))
                odd.append({"rank": rank["rank"], "node": rank["node"], "pid": rank["pid"],
                            "frame": innermost(rank), "last_line": rank.get("last_line") or "",
                            "stopped": stopped, "where": rank.get("where")})
        else:
            numbers = [r["rank"] for r in members]
            out.append("stall: %s %s (%s) wait in %s" % (
                "rank" if len(numbers) == 1 else "ranks", fold_ranks(numbers),
                fold_nodes(sorted({r["node"] for r in members})), wait or where))
            waiting = {"ranks": numbers, "in": wait or where}
    for name, why in sorted(problems.items()):
        out.append("stall: no stacks from %s: %s" % (name, why))
    for rank in sorted((r for r in ranks if r.get("error")), key=lambda r: r["rank"]):
        out.append("stall: no stack from rank %d on %s (pid %d): %s" % (
            rank["rank"], rank["node"], rank["pid"], rank["error"]))
    return out, {"timeout": timeout, "odd": odd, "waiting": waiting}


def blind(ranks: Sequence[Rank], timeout: float,
          problems: Optional[Mapping[str, str]] = None) -> List[str]:
    """No rank's stack could be read (no py-spy there, no permission): what could not be seen,
    per host and per rank, and no rank or host named as the cause."""
    out = ["stall: no rank made progress for %s s; %s" % ("%g" % timeout, BLIND)]
    for name, why in sorted((problems or {}).items()):
        out.append("stall: no stacks from %s: %s" % (name, why))
    for rank in sorted(ranks, key=lambda r: (r["rank"], r["node"])):
        out.append("stall: rank %d on %s (pid %d): %s; last line: %r" % (
            rank["rank"], rank["node"], rank["pid"], rank.get("error") or "no stack",
            rank.get("last_line") or ""))
    if not ranks and not problems:
        out.append("stall: no rank was found on any host")
    return out


def odd_node(record: Record) -> Optional[str]:
    """The host of the first odd rank out, or None (none stood out, or none could be seen)."""
    return record["odd"][0]["node"] if record.get("odd") else None


def stop_detail(lines: Sequence[str]) -> str:
    """The failure a stopped stall records: its odd rank out, or the report's first line."""
    odd = [x for x in lines if "odd one out" in x]
    return ("stalled, %s" % (odd[0] if odd else lines[0] if lines else "no progress")
            ).replace("stall: ", "", 1)


def stop(lines: Sequence[str], record: Record) -> Tuple[Optional[str], str]:
    """``(host, detail)``: the host a stall stopped with --on-stall stop fails, and the detail
    of its failure (wire.RootCause reads the blamed host and rank back from it). The first odd
    rank's host; with none, the first host whose links failed the re-test (``record["links"]``,
    linkrule.py); with neither, None: the master only ends the run, and no host is blamed."""
    host = odd_node(record)
    blamed = (record.get("links") or {}).get("blamed") or []
    if host is None and blamed:
        head = LINKS_ROOT % blamed[0]
        said = next((x[len(head):] for x in lines if x.startswith(head)), "")
        return blamed[0], "stalled, " + LINKS_FAIL + said
    return host, stop_detail(lines)
