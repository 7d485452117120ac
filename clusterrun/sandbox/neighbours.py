"""Room in the kernel's neighbour (ARP) table for a sandbox's all-pairs traffic.

The table is one for the whole machine, shared by every network namespace: n hosts that all
connect to each other (preflight's mesh, Gloo's and NCCL's all-pairs) hold about n² entries,
and past ``gc_thresh3`` (1024 by default) the kernel drops packets, which shows up as timeouts
a real cluster would not have. ``make_room`` raises the limits when a sandbox needs more; the
last sandbox's ``down`` puts back the values found before the first one raised them.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from clusterrun.sandbox import net

SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")
LIMITS = ("gc_thresh2", "gc_thresh3")
SAVED = "neighbour-limits.json"  # under net.RUN_DIR, while a sandbox has raised them
SMALL = 16  # hosts whose mesh (256 entries) fits in the default table beside the machine's own


def needed(hosts: int) -> dict[str, int]:
    top = 2 * hosts * hosts + 1024
    return {"gc_thresh2": top // 2, "gc_thresh3": top}


def _read() -> dict[str, int]:
    return {name: int((SYSCTL / name).read_text()) for name in LIMITS}


def _write(values: dict[str, int]) -> None:
    # gc_thresh2 must not exceed gc_thresh3 at any moment: raise the top first, lower it last.
    order = ("gc_thresh3", "gc_thresh2") if values["gc_thresh3"] >= _read()["gc_thresh3"] \
        else ("gc_thresh2", "gc_thresh3")
    for name in order:
        (SYSCTL / name).write_text(str(values[name]))


def make_room(hosts: int) -> None:
    """Raise the limits for ``hosts`` more hosts, under net.allocation_lock(). Best effort: where
    /proc/sys is read-only the limits stay, and only meshes past ~20 hosts notice."""
    if hosts <= SMALL:
        return
    with contextlib.suppress(OSError, ValueError):
        have = _read()
        want = needed(hosts)
        if all(have[name] >= want[name] for name in LIMITS):
            return
        saved = net.RUN_DIR / SAVED
        if not saved.exists():
            saved.write_text(json.dumps(have))
        _write({name: max(have[name], want[name]) for name in LIMITS})


def restore_if_last() -> None:
    """After a sandbox is gone (its directory under net.RUN_DIR removed): with no other sandbox
    left, put back the limits found before the first one raised them."""
    saved = net.RUN_DIR / SAVED
    with contextlib.suppress(OSError, ValueError), net.allocation_lock():
        if not saved.exists() or any(p.is_dir() for p in net.RUN_DIR.iterdir()):
            return
        _write({name: int(value) for name, value in json.loads(saved.read_text()).items()})
        saved.unlink()
