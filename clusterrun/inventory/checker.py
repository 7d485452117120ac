"""Collecting an inventory's problems, each with the file and line it is about."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from clusterrun.errors import InventoryError
from clusterrun.inventory.hosts import HostSpec
from clusterrun.inventory.yaml_lines import Located


class Checker:
    """Collects every problem in the file (and the hostfile it names) so one run shows them all."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[tuple[str, int, str]] = []

    def fail(self, line: int, message: str, path: Optional[str] = None) -> None:
        self.problems.append((path or str(self.path), line, message))

    def absorb(self, other: Checker) -> None:
        self.problems.extend(other.problems)

    def raise_if_any(self) -> None:
        if not self.problems:
            return
        own = str(self.path)
        # A range's hosts share a line and repeat the same problem: say it once.
        unique = list(dict.fromkeys(self.problems))
        ordered = sorted(unique, key=lambda p: (p[0] != own, p[0], p[1]))
        raise InventoryError("\n".join(f"{path}:{line}: {msg}" for path, line, msg in ordered))

    def keys(self, loc: Located, allowed: tuple[str, ...], where: str) -> dict[str, Located]:
        if not isinstance(loc.value, dict):
            self.fail(loc.line, f"{where} must be a mapping of `key: value` lines.")
            return {}
        for key, val in loc.value.items():
            if key not in allowed:
                hint = closest(key, allowed)
                fix = f" Did you mean `{hint}`?" if hint else ""
                self.fail(val.line, f"{where}: unknown key `{key}`.{fix} Known keys: "
                          f"{', '.join(allowed)}.")
        return {k: v for k, v in loc.value.items() if k in allowed}


def closest(word: str, options: tuple[str, ...]) -> Optional[str]:
    import difflib

    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return match[0] if match else None


def _at(h: HostSpec) -> str:
    return f"{h.source}:{h.line}" if h.source else f"line {h.line}"


def check_unique(chk: Checker, hosts: list[HostSpec]) -> None:
    masters = [h for h in hosts if h.master]
    if len(masters) > 1:
        lines = ("lines " + ", ".join(str(h.line) for h in masters)
                 if not any(h.source for h in masters) else ", ".join(_at(h) for h in masters))
        chk.fail(masters[1].line, f"more than one host has `master: true` ({lines}); "
                 "mark exactly one, or none to make the first host the master.", masters[1].source)
    names: dict[str, HostSpec] = {}
    addrs: dict[tuple[str, Optional[int]], HostSpec] = {}
    for h in hosts:
        key = (h.host, h.port)
        if key in addrs and not h.local:
            chk.fail(h.line, f"host {h.host!r} is listed twice (also {_at(addrs[key])}); two "
                     "launches on one machine would fight over its GPUs and ports. Remove one.",
                     h.source)
            continue  # its name clashes too, most likely: one message is enough
        addrs.setdefault(key, h)
        if h.name in names:
            chk.fail(h.line, f"the name {h.name!r} is already used by the host on "
                     f"{_at(names[h.name])}; give each host its own `name:`.", h.source)
        names.setdefault(h.name, h)
