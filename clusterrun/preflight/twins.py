"""Two inventory entries that reach the same machine: its address and its name, an
~/.ssh/config alias next to the address, a host listed twice under two names.

Both would get ranks: the machine's GPUs counted twice, two torchruns with LOCAL_RANK 0 on the
same GPU, twice the CPU threads the machine has. Told apart by what the probe reads there (the
kernel's boot id and the network namespace, clusterrun/remote/probe/sysinfo.py), never by names or
addresses, which are exactly what differs between the two entries.

Policy (docs/troubleshooting.md): a failure for every entry reached over SSH or Slurm, since
nothing in the inventory can make two such entries share a machine safely; entries on this
machine itself (`transport: local`, localhost) may repeat, as the demo does on purpose; two
different containers on one machine are two hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from clusterrun.preflight.report import HostReport

Identity = tuple[str, int, str]


def identity(report: HostReport) -> Optional[Identity]:
    """The running system an entry reached, or None when the probe could not tell."""
    found = report.known.machine
    if found.system is None or found.netns is None:
        return None
    return found.system, found.netns, report.spec.container or ""


def judge(reports: Sequence[HostReport]) -> None:
    """A failed `same_machine` check on each later entry that reaches a machine an earlier
    entry reaches, naming both."""
    first: dict[Identity, HostReport] = {}
    for r in reports:
        if r.outcome is not None or not r.facts:
            continue
        key = identity(r)
        if key is None:
            if len(reports) > 1:
                r.add("same_machine", True, f"warning: whether {_label(r)} is the same machine "
                      "as another entry is unknown: the probe did not report its boot id and "
                      "network namespace, so that was not checked.", group="warning: whether "
                      "it is the same machine as another entry is unknown: the probe did not "
                      "report its boot id and network namespace")
            continue
        seen = first.setdefault(key, r)
        if seen is r or (seen.spec.local and r.spec.local):
            continue
        hostname = r.known.hostname or "?"
        r.add("same_machine", False,
              f"{_label(r)} and {_label(seen)} are the same machine (hostname {hostname}, "
              "the same boot id and network namespace): "
              "both entries would start ranks there, counting its GPUs and CPUs twice. List "
              "each machine once in the inventory; to run more ranks on it, raise its "
              "`nproc_per_node:`.",
              group="the same machine as another entry; list each machine once")


def _label(report: HostReport) -> str:
    spec = report.spec
    return spec.name if spec.host == spec.name else f"{spec.name} ({spec.host})"
