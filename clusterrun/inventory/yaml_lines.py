"""YAML with line numbers and duplicate-key detection, for error messages that point at a line."""

from __future__ import annotations

import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import yaml

from clusterrun.errors import InventoryError


@dataclass(frozen=True)
class Located:
    """A YAML value with its 1-based line: where its key is, for a value in a mapping; else
    where it starts."""

    value: Any  # scalar, list[Located] or dict[str, Located]
    line: int


# An inventory is a few levels deep (hosts, a host, its env); PyYAML composes and this module
# converts a node by recursion, so a file of 1,000 `[` would end in a RecursionError.
MAX_DEPTH = 32
MAX_BYTES = 16 << 20
ANCHORS_FIX = "write the value out; anchors and aliases are not supported"


class _Refused(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


class _Peeks(Protocol):
    """PyYAML's parser as its stubs leave it untyped: the one method used here, typed."""

    def peek_event(self) -> yaml.Event: ...


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses anchors (``&a``) and aliases (``*a``) as the parser meets them,
    before anything is composed: an alias makes a graph of a tree, so nine levels of nine
    aliases in 256 bytes stand for 387 million values, and ``&a [*a]`` for an endless one."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = cast(_Peeks, self).peek_event()
        mark = event.start_mark  # None only for events built by hand, never the parser's
        line = mark.line + 1 if mark is not None else 0
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(line, f"a YAML anchor or alias (&name, *name): {ANCHORS_FIX}.")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(line, f"values nested more than {MAX_DEPTH} levels deep; an "
                           "inventory is hosts, a host and its settings. Check the brackets "
                           "and indentation.")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load(path: Path) -> Located:
    """Parse ``path``; raise InventoryError for a missing file, bad YAML or a duplicate key."""
    try:
        with path.open("rb") as handle:  # /dev/zero, or a log given by mistake: never read it all
            data = handle.read(MAX_BYTES + 1)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise InventoryError(
            f"{path}: no such inventory file. Pass the path of a YAML inventory; the smallest "
            "is one line naming the hosts as ssh reaches them, `hosts: [{host: gpu-a}, "
            "{host: gpu-b}]` (every key: docs/inventory.md)."
        ) from None
    except IsADirectoryError:
        found = sorted(p.name for p in path.glob("*.y*ml"))[:3]
        inside = f" ({', '.join(found)} there?)" if found else ""
        raise InventoryError(f"{path} is a directory; INVENTORY is the YAML file itself{inside}."
                             ) from None
    except PermissionError:
        raise InventoryError(
            f"{path}: cannot read the inventory: permission denied ({_owner(path)}). Make it "
            f"readable for this user (e.g. `chmod a+r {path}`) or pass a copy you can read."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc}.") from None
    if len(data) > MAX_BYTES:
        raise InventoryError(f"{path}: more than {MAX_BYTES >> 20} MB; an inventory is a few "
                             "lines per host. Is this the inventory?")
    try:
        node = yaml.compose(text, Loader=_Loader)
    except _Refused as exc:
        raise InventoryError(f"{path}:{exc.line}: {exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = exc.problem or exc.context or "invalid YAML"
        start = exc.context_mark.line + 1 if exc.context_mark else line
        # An unclosed bracket or quote is reported where the file ends: say where it opened.
        opened = f" ({exc.context} on line {start})" if exc.context and start != line else ""
        raise InventoryError(
            f"{path}:{line}: YAML syntax error: {problem}{opened}. Check indentation and quoting "
            "on that line (values containing ':' or '#' need quotes)."
        ) from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: YAML syntax error: {exc}.") from None
    if node is None:
        raise InventoryError(f"{path}:1: the inventory is empty; it needs at least a `hosts:` "
                             "list.")
    return _convert(path, node)


def _owner(path: Path) -> str:
    try:
        st = path.stat()
        owner = pwd.getpwuid(st.st_uid).pw_name
    except (OSError, KeyError):
        return "a directory on its path is closed to you"
    return f"it belongs to {owner} with mode {stat.S_IMODE(st.st_mode):04o}"


def _convert(path: Path, node: yaml.Node) -> Located:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Located] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InventoryError(f"{path}:{line}: mapping keys must be plain names.")
            key = str(key_node.value)
            if key in out:
                first = out[key].line
                raise InventoryError(
                    f"{path}:{key_node.start_mark.line + 1}: duplicate key `{key}` (first set "
                    f"on line {first}); YAML would silently keep only the last one. Remove one of "
                    "them."
                )
            # A value in a mapping is located at its key: a list or a mapping starts on the
            # lines below it, but messages about `key:` must point at `key:`.
            out[key] = Located(_convert(path, value_node).value, key_node.start_mark.line + 1)
        return Located(out, line)
    if isinstance(node, yaml.SequenceNode):
        return Located([_convert(path, item) for item in node.value], line)
    if node.tag == "tag:yaml.org,2002:timestamp":
        # A date-like value (e.g. an unquoted version) is meant as text here.
        return Located(str(node.value), line)
    try:
        value = yaml.SafeLoader("").construct_object(node, deep=True)
        if isinstance(value, int):
            str(value)  # a 0x... of thousands of digits: too long to print in any message
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}:{line}: cannot read this value: {exc}.") from None
    # An explicit tag (`!!int ''`, `!!bool maybe`) hands the text to int(), float() or a dict
    # lookup as it is.
    except (ArithmeticError, LookupError, ValueError, TypeError):
        tag = str(node.tag).rsplit(":", 1)[-1]
        shown = str(node.value) if len(str(node.value)) <= 40 else str(node.value)[:40] + "..."
        raise InventoryError(f"{path}:{line}: cannot read {shown!r} as a YAML {tag}. Write "
                             "a plain string, number, true or false.") from None
    return Located(value, line)
