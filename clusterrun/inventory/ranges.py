"""Host ranges (``gpu[01-16]``, ``10.0.0.[11-14]``), expanded and folded by ClusterShell's
NodeSet."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Optional

from clusterrun.inventory.checker import Checker
from clusterrun.inventory.yaml_lines import Located

# A range is expanded into that many hosts; a typo such as gpu[1-100000] should not be.
MAX_HOSTS = 4096


def is_range(text: Any) -> bool:
    return isinstance(text, str) and "[" in text


def at_most(text: str) -> int:
    """An upper bound on the names ``text`` stands for, found without expanding it: NodeSet
    builds every name first (ten seconds for gpu[1-10000000], and memory to match). Each
    bracket counts the sum of its ranges, brackets in one pattern multiply, patterns add."""
    total = 0
    for pattern in re.split(r",(?![^\[]*\])", text):  # the commas outside brackets
        count = 1
        for inner in re.findall(r"\[([^\]]*)\]", pattern):
            size = 0
            for piece in inner.split(","):
                low, _, high = piece.partition("/")[0].partition("-")
                if low.strip().isdigit() and high.strip().isdigit():
                    if max(len(low.strip()), len(high.strip())) > 12:
                        return MAX_HOSTS + 1
                    size += abs(int(high) - int(low)) + 1
                else:
                    size += 1
            count *= max(size, 1)
            if count > MAX_HOSTS:
                return count
        total += count
    return total


def expand(text: str) -> list[str]:
    """The names a range stands for, in order; ValueError with a plain message if it is not one."""
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    if at_most(text) > MAX_HOSTS:
        raise ValueError(f"{text!r} stands for more than {MAX_HOSTS} hosts; at most "
                         f"{MAX_HOSTS}.")
    try:
        nodes = NodeSet(text)
    except (NodeSetException, ValueError) as exc:
        raise ValueError(f"{text!r} is not a valid host range ({exc}); write e.g. gpu[01-16] "
                         "or 10.0.0.[11-14].") from None
    if len(nodes) > MAX_HOSTS:
        raise ValueError(f"{text!r} stands for {len(nodes)} hosts; at most {MAX_HOSTS}.")
    return list(nodes)


def fold(names: Iterable[str]) -> str:
    """The shortest NodeSet text for these names, e.g. gpu[01-03,07]."""
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(names)))


def expand_items(chk: Checker, items: list[Located], where: str = "hosts") -> list[Located]:
    """Host entries with a range in `host:` become one entry per host, on the same line. A
    `name:` beside a range must be a range of the same size (gpu-[a-d]); without one each host
    is named after its address."""
    out: list[Located] = []
    for index, item in enumerate(items):
        entry = item.value
        host = entry if isinstance(entry, str) else (
            entry["host"].value if isinstance(entry, dict) and "host" in entry else None)
        if not isinstance(host, str) or not is_range(host):
            out.append(item)
            continue
        host_line = item.line if isinstance(entry, str) else entry["host"].line
        try:
            hosts = expand(host)
        except ValueError as exc:
            chk.fail(host_line, f"{where}[{index}].host {exc}")
            continue
        names: Optional[list[str]] = None
        name_loc = entry.get("name") if isinstance(entry, dict) else None
        if name_loc is not None:
            names = _names(chk, name_loc, len(hosts), f"{where}[{index}]")
            if names is None:
                continue
        for n, one in enumerate(hosts):
            value = dict(entry) if isinstance(entry, dict) else {}
            value["host"] = Located(one, host_line)
            if names is not None and name_loc is not None:
                value["name"] = Located(names[n], name_loc.line)
            out.append(Located(value, item.line))
        if len(out) > MAX_HOSTS:
            # Each range may be in bounds and fifty of them not: stop before validating them all.
            chk.fail(item.line, f"the hosts here stand for more than {MAX_HOSTS} hosts in all; "
                     f"at most {MAX_HOSTS}.")
            return []
    return out


def _names(chk: Checker, loc: Located, count: int, where: str) -> Optional[list[str]]:
    if not is_range(loc.value):
        chk.fail(loc.line, f"{where}.name {loc.value!r}: a range host stands for {count} hosts "
                 "and each needs its own name; make the name a range of the same size (e.g. "
                 "gpu-[a-d]) or leave `name:` out to name each host after its address.")
        return None
    try:
        names = expand(loc.value)
    except ValueError as exc:
        chk.fail(loc.line, f"{where}.name {exc}")
        return None
    if len(names) != count:
        chk.fail(loc.line, f"{where}.name {loc.value!r} stands for {len(names)} names but the "
                 f"host range for {count} hosts; make them the same size.")
        return None
    return names


def fold_numbers(numbers: Iterable[int]) -> str:
    """Numbers folded by ClusterShell's RangeSet: ``[0, 1, 2, 4]`` -> ``0-2,4``."""
    from ClusterShell.RangeSet import RangeSet

    return str(RangeSet.fromlist([str(n) for n in sorted(set(numbers))]))
