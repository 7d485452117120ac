"""Typed per-rank stacks, as `stacks --json` prints them (docs/commands.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def short(self) -> str:
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class Thread:
    name: str
    frames: tuple[Frame, ...]  # outermost first, as in a traceback
    active: Optional[bool] = None  # py-spy: running (True) or idle, blocked in a wait (False)


@dataclass(frozen=True)
class Child:
    """A child process of a rank (a DataLoader worker) and its stacks."""
    pid: int
    label: str  # "DataLoader worker 0", "child process"
    threads: tuple[Thread, ...]
    state: Optional[str] = None


@dataclass(frozen=True)
class RankStack:
    rank: int
    node: str
    pid: int
    threads: tuple[Thread, ...]
    state: Optional[str] = None  # /proc state: "T" is a stopped process (SIGSTOP)
    error: Optional[str] = None  # why no stack could be taken
    last_line: str = ""
    wait_share: Optional[float] = None  # --profile: share of samples waiting in collectives
    samples: Optional[int] = None  # --profile: how many samples the share is made of
    children: tuple[Child, ...] = ()
    # the user's own line and call, its workers' (remote/hostlib/pystack.py)
    where: Optional[str] = None
    at: Optional[str] = None  # the user's own frame, short: ``<module> (train.py:9) `...```

    @property
    def main(self) -> Optional[Thread]:
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        return self.threads[0] if self.threads else None

    def to_json(self) -> dict[str, Any]:
        threads = _threads(self.threads)
        out: dict[str, Any] = {"rank": self.rank, "node": self.node, "pid": self.pid,
                               "threads": threads}
        if self.where:
            out["where"] = self.where
        if self.at:
            out["at"] = self.at
        if self.children:
            out["children"] = [{"pid": c.pid, "label": c.label, "threads": _threads(c.threads)}
                               for c in self.children]
        if self.wait_share is not None:
            out["wait_share"] = self.wait_share
        if self.samples is not None:
            out["samples"] = self.samples
        return out


def as_sent(rank: RankStack) -> dict[str, Any]:
    """A rank as a host's stacks.py sends it (remote/hostlib/pystack.py ``dump_all``), with its
    node: what the stall report's rule (remote/shared/stallreport.py) reads."""
    return dict(rank.to_json(), state=rank.state, error=rank.error, last_line=rank.last_line)


@dataclass
class Collected:
    run: str
    ranks: list[RankStack] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)  # node -> why it gave no stacks
    flight: list[dict[str, Any]] = field(default_factory=list)  # torch's Flight Recorder
    stragglers: Optional[list[int]] = None  # --profile: stacks/profile.py
    partial: bool = False  # only some hosts or ranks were asked (--node, --rank)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "ranks": [r.to_json() for r in self.ranks]}
        if self.stragglers is not None:
            out["stragglers"] = self.stragglers
        return out


def _threads(threads: tuple[Thread, ...]) -> list[dict[str, Any]]:
    return [{"name": t.name, "active": t.active, "frames": [
        {"function": f.function, "file": f.file, "line": f.line} for f in t.frames]}
        for t in threads]


def _read_threads(raw: Any) -> tuple[Thread, ...]:
    return tuple(Thread(str(t.get("name", "")), tuple(
        Frame(str(f["function"]), str(f["file"]), int(f["line"])) for f in t.get("frames", [])),
        t.get("active")) for t in raw or [])


def from_reply(node: str, entry: dict[str, Any]) -> RankStack:
    threads = _read_threads(entry.get("threads"))
    children = tuple(Child(int(c["pid"]), str(c.get("label") or "child process"),
                           _read_threads(c.get("threads")), c.get("state"))
                     for c in entry.get("children") or [])
    return RankStack(rank=int(entry["rank"]), node=node, pid=int(entry["pid"]), threads=threads,
                     children=children, where=entry.get("where"), at=entry.get("at"),
                     state=entry.get("state"), error=entry.get("error"),
                     last_line=str(entry.get("last_line") or ""),
                     wait_share=_wait_share(entry.get("profile")),
                     samples=(entry.get("profile") or {}).get("samples"))


def _wait_share(profiled: Optional[dict[str, Any]]) -> Optional[float]:
    """--profile: the share of a rank's samples spent waiting (remote/tools/profiler.py)."""
    if not profiled or not profiled.get("samples"):
        return None
    return round(int(profiled["waiting"]) / int(profiled["samples"]), 3)
