"""The verdict of an all-pairs link test (stdlib only, Python 3.6+): which host each failed
pair is put on, and the words. One rule for `check`'s pairs (preflight/mesh.py) and for the
stall watchdog's re-test of a stalled run's links, judged by the master's supervisor whether
an attached run's controller ran the test (stacks/links.py) or a detached run's hub did
(linkwatch.py, shipped with the supervisor), so `check` and the stall blame the same host.

A failed pair is a ``(source, target, error)`` triple (preflight's ``Blocked`` is one):
``source`` could not connect to an ephemeral port of ``target``.
"""

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from clusterrun.remote.shared import stallreport

# A failed pair: (source, target, error). The rule gives back the caller's own kind of triple.
Pair = Tuple[str, str, str]
P = TypeVar("P", bound=Pair)
Fold = Callable[[Iterable[str]], str]


def blamed(hosts: Sequence[str], blocked: Sequence[P]) -> Dict[str, List[P]]:
    """``{host: its failed pairs}``: a pair is put on the host nobody reaches (its firewall or
    link), or on the host that reaches nobody (its egress); otherwise on the one connected to."""
    incoming: Dict[str, int] = {}
    outgoing: Dict[str, int] = {}
    for source, target, _error in blocked:
        incoming[target] = incoming.get(target, 0) + 1
        outgoing[source] = outgoing.get(source, 0) + 1
    others = len(hosts) - 1
    out: Dict[str, List[P]] = {}
    for pair in blocked:
        source, target = pair[0], pair[1]
        if incoming[target] < others and outgoing[source] == others:
            out.setdefault(source, []).append(pair)
        else:
            out.setdefault(target, []).append(pair)
    return out


def failed_pairs(name: str, address: Optional[str], mine: Sequence[Pair],
                 fold: Fold = stallreport.fold_hosts) -> str:
    """What a host's failed pairs (``blamed()``'s for it) say: who cannot reach it, and whom it
    cannot reach. ``fold`` writes host names as one text (``node[1,3]``): the controller passes
    ClusterShell's, the hosts have the standard library's fold of the same form."""
    into = [p for p in mine if p[1] == name]
    out = [p for p in mine if p[0] == name]
    parts = []
    if into:
        parts.append("%s cannot connect to %s (%s) on an ephemeral port: %s" % (
            fold([p[0] for p in into]), name, address or "?", into[0][2]))
    if out:
        parts.append("%s cannot connect to %s on an ephemeral port: %s" % (
            name, fold([p[1] for p in out]), out[0][2]))
    return "; ".join(parts)


def judge(hosts: Sequence[str], blocked: Iterable[Pair], addresses: Mapping[str, str],
          untested: Optional[Mapping[str, str]] = None, fold: Fold = stallreport.fold_hosts,
          ) -> Tuple[List[str], Dict[str, Any], Optional[str]]:
    """A stall's link re-test judged: ``(lines, record, host)``. The lines name each blamed
    host as a root cause, the host with the most failed pairs first (it is the one blamed,
    ``host``; None when no pair failed), or say the links are fine, then the hosts that could
    not be tested (``untested``: {host: why}; neither tested nor blamed)."""
    untested = untested or {}
    pairs = sorted(blocked)  # by source, then target: as the pairs arrived on either side
    blame = blamed(hosts, pairs)
    ranked = sorted(blame, key=lambda h: (-len(blame[h]), h))
    lines = [stallreport.LINKS_ROOT % name
             + failed_pairs(name, addresses.get(name), blame[name], fold) for name in ranked]
    fine = not ranked and len(hosts) > 1
    if fine:
        lines.append("stall: links fine: every pair of the run's %d hosts connects on an "
                     "ephemeral port of the run's addresses, so no host's data path is the "
                     "cause" % len(hosts))
    lines.extend("stall: links of %s not tested: %s" % (name, why)
                 for name, why in sorted(untested.items()))
    record = {"tested": sorted(hosts), "fine": fine, "blamed": ranked, "untested": untested,
              "failed": [{"source": p[0], "target": p[1], "error": p[2]} for p in pairs]}
    return lines, record, ranked[0] if ranked else None
