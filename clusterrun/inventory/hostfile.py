"""DeepSpeed / MPI hostfiles: one `host [slots=N]` per line, `#` comments, blank lines."""

from __future__ import annotations

import re
from pathlib import Path

from clusterrun.inventory.checker import Checker
from clusterrun.inventory.yaml_lines import Located

# What tells a hostfile from a YAML inventory: every line that is not blank or a comment is a
# host (not ending in ':' as YAML keys do, not a '- ' list item) and then only key=value words.
_LINE_RE = re.compile(r"^\s*(?![-{\[])[^\s#=]*[^\s#=:](\s+[A-Za-z_]+=\S*)*\s*(#.*)?$")
_MAX_BYTES = 1 << 20


def _content(line: str) -> str:
    return line.split("#", 1)[0].strip()


def looks_like(path: Path) -> bool:
    """True for a readable file whose every meaningful line reads `host [key=value ...]`."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_BYTES:
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    lines = [line for line in text.splitlines() if _content(line)]
    return bool(lines) and all(_LINE_RE.match(line) for line in lines)


def read(chk: Checker, path: Path) -> list[Located]:
    """The hostfile's hosts as inventory entries ({host, nproc_per_node}), each at its own line;
    problems go to ``chk`` (whose path should be the hostfile's)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        chk.fail(1, f"cannot read the hostfile: {why}.")
        return []
    items: list[Located] = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = _content(line).split()
        if not words:
            continue
        entry = {"host": Located(words[0], number)}
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key != "slots" or not eq:
                chk.fail(number, f"{word!r}: a hostfile line is `host` or `host slots=N` "
                         "(DeepSpeed/MPI format); nothing else is understood.")
            elif not value.isdigit() or int(value) < 1:
                chk.fail(number, f"slots={value}: slots must be a positive whole number.")
            else:
                entry["nproc_per_node"] = Located(int(value), number)
        items.append(Located(entry, number))
    if not items and not chk.problems:
        chk.fail(1, "the hostfile lists no hosts; write one `host slots=N` per line.")
    return items
