"""The frames a user can act on in a rank's stack (stdlib only, Python 3.6+): the innermost
one in the user's own code with its source line, the library call it is in, and the same for
the rank's child processes (DataLoader workers). pystack.py takes the stacks; the stall report
(stallreport.py) and `stacks` name ranks by these.
"""

from typing import Any, Dict, Optional, Sequence

# A frame, a thread and a rank's entry as remote/hostlib/pystack.py gives them (JSON on the wire).
Frame = Dict[str, Any]
Thread = Dict[str, Any]


def main_thread(threads: Sequence[Thread]) -> Optional[Thread]:
    found = [t for t in threads if t.get("name") == "MainThread"] or threads[:1]
    return found[0] if found else None


def _source(path: str, line: int) -> str:
    """Line ``line`` of a source file, stripped, at most 120 characters ("" if unreadable)."""
    try:
        with open(path, "rb") as handle:
            for number, text in enumerate(handle, 1):
                if number == line:
                    return text.decode("utf-8", "replace").strip()[:120]
    except OSError:
        pass
    return ""


def _library(path: str) -> bool:
    return ("site-packages/" in path or "dist-packages/" in path or "/lib/python" in path
            or path.startswith("<"))


def _wrapper(function: str) -> bool:
    """A decorator's frame (torch wraps its collectives): not the call a user made."""
    return "<locals>" in function or function.rsplit(".", 1)[-1] in ("wrapper", "wrapped")


def user_frame(frames: Sequence[Frame], code: Optional[str],
               start: int = 0) -> Optional[Frame]:
    """The innermost frame from ``start`` on in the user's own code (under ``code``, the
    script's directory; else outside any installed package and the standard library), with its
    source line and the library call it is in (the next frame inward that is not a decorator's):
    ``{"function", "file", "line", "text", "call"}``."""
    for index in range(len(frames) - 1, start - 1, -1):
        frame = frames[index]
        mine = frame["file"].startswith(code.rstrip("/") + "/") if code else \
            not _library(frame["file"])
        if mine:
            inner = [f["function"] for f in frames[index + 1:] if not _wrapper(f["function"])]
            return dict(frame, text=_source(frame["file"], frame["line"]),
                        call=inner[0] if inner else None)
    return None


def _phrase(user: Frame, active: Optional[bool]) -> str:
    """``waits in `for batch in loader` (train.py:33), in `_BaseDataLoaderIter.__next__```."""
    text = "`%s`" % user["text"] if user.get("text") else "`%s`" % user["function"]
    out = "%s %s (%s:%d)" % ("waits in" if active is False else "is in", text,
                             user["file"].rsplit("/", 1)[-1], user["line"])
    if user.get("text") and user.get("function") not in ("<module>", None):
        out += " in `%s`" % user["function"]
    if user.get("call"):
        out += ", inside `%s`" % user["call"]
    return out


def at(user: Frame) -> str:
    """The user's own frame, short, for the one line that names an odd rank (and the root cause
    a stopped stall records): ``<module> (train.py:33) `for batch in loader:```."""
    return "%s (%s:%d)%s" % (user["function"], user["file"].rsplit("/", 1)[-1], user["line"],
                             " `%s`" % user["text"] if user.get("text") else "")


def where(entry: Dict[str, Any]) -> Optional[str]:
    """One line for a rank a user can act on: its own innermost line and the library call it is
    in, then each child process (a DataLoader worker) that is in the user's code."""
    main = main_thread(entry.get("threads") or [])
    user = entry.get("user")
    if main is None or user is None:
        return None
    out = "rank %d %s" % (entry["rank"], _phrase(user, main.get("active")))
    for child in entry.get("children") or []:
        if child.get("user"):
            cmain = main_thread(child.get("threads") or []) or {}
            out += "; %s (pid %d) %s" % (child["label"], child["pid"],
                                         _phrase(child["user"], cmain.get("active")))
    return out
