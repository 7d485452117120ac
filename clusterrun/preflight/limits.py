"""The limits the job will run under on each host, and its RDMA devices: read by the probe the
way the job starts (after `setup:`, inside the container), judged here.

- /dev/shm: NCCL's intra-node transport and DataLoader workers live there; containers get
  64 MiB by default, and NCCL then fails at init with an unhandled system error (nccl#342).
- open files: NCCL opens several sockets per peer; thousands of ranks need more than the usual
  soft limit of 1024 (nccl#1917).
- locked memory: RDMA registers (locks) its buffers; without `ulimit -l unlimited` IB fails to
  register memory (nccl-tests#206).
- stack: NCCL's documentation warns against an unlimited stack size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

from clusterrun.inventory import HostSpec
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.limit_facts import IbPort, Limits
from clusterrun.preflight.report import Check, warn

SHM = "/dev/shm"  # noqa: S108 - named in messages, nothing is written there
MiB = 1 << 20
GiB = 1 << 30
SHM_FAIL = 512 * MiB  # below this, NCCL's shared-memory transport fails with several GPUs
SHM_WARN = 1 * GiB
MEMLOCK_FAIL = 64 * MiB
NOFILE_PER_RANK = 16


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n // MiB} MiB"


# The limits every host is judged on, as the probe names them. A limit the probe sends as
# [None, None] is unlimited; one it does not send (or /dev/shm it could not stat) is unknown.
JUDGED = (("shm", f"{SHM} size"), ("nofile", "open files"), ("stack", "stack size"))


def host_checks(spec: HostSpec, facts: HostFacts, *, gpu_ranks: int,
                world: int) -> list[Check]:
    limits = facts.limits
    out = [c for c in (_shm(spec, limits, gpu_ranks), _nofile(spec, limits, world),
                       _stack(spec, limits)) if c is not None]
    out.extend(_rdma(spec, facts, limits))
    unknown = [what for key, what in JUDGED if getattr(limits, key) is None]
    if unknown:
        said = ", ".join(unknown)
        out.append(warn("limits", f"{said} unknown on {spec.name}: the probe could not read "
                        "them, so they were not checked (`ulimit -a` and `df /dev/shm` there, "
                        "after `setup:`, say).", f"{said} unknown: the probe could not read "
                        "them, so they were not checked"))
    # Both known whenever nothing was warned (an unknown limit is a warning above).
    if limits.nofile and limits.shm is not None and not any(not c.ok or c.warning for c in out):
        out.append(Check("limits", True, f"{SHM} {_size(limits.shm)}, open files "
                         f"{limits.nofile.soft or 'unlimited'}"))
    return out


def _shm(spec: HostSpec, limits: Limits, gpu_ranks: int) -> Optional[Check]:
    size = limits.shm
    if size is None:
        return None
    fix = ("Give the container more (docker/podman run --shm-size=16g, or --ipc=host), or "
           "remount it larger (mount -o remount,size=16G " + SHM + ").")
    if gpu_ranks >= 2 and size < SHM_FAIL:
        return Check("shm", False, f"{SHM} on {spec.name} is {_size(size)}: NCCL's "
                     f"transport between its {gpu_ranks} GPU ranks there needs more and fails "
                     f"at init. {fix}", f"{SHM} is {_size(size)}, too small for NCCL "
                     "between the GPUs of one host. " + fix)
    if size < SHM_WARN:
        return warn("shm", f"{SHM} on {spec.name} is {_size(size)}: DataLoader workers "
                    f"and NCCL keep shared memory there and may fail with a bus error. {fix}",
                    f"{SHM} is only {_size(size)}. {fix}")
    return None


def _nofile(spec: HostSpec, limits: Limits, world: int) -> Optional[Check]:
    if limits.nofile is None:
        return None  # unknown: host_checks says so
    soft, hard = limits.nofile.soft, limits.nofile.hard
    need = max(1024, NOFILE_PER_RANK * world)
    if soft is None or soft >= need:
        return None
    raise_to = need if hard is None else min(max(need, 65536), hard)
    how = (f"Add `ulimit -n {raise_to}` to `setup:`" if hard is None or hard >= need else
           f"The hard limit is {hard}: raise it in /etc/security/limits.conf (or the "
           "container's --ulimit nofile=...) and add `ulimit -n` to `setup:`")
    return warn("nofile", f"open files are limited to {soft} on {spec.name}; with {world} "
                f"ranks NCCL may need about {need} (a socket or more per peer) and fail with "
                f"'Too many open files'. {how}.",
                f"open files limited to {soft} (about {need} needed for {world} ranks). {how}.")


def _stack(spec: HostSpec, limits: Limits) -> Optional[Check]:
    if limits.stack is None or limits.stack.soft is not None:
        return None  # unknown (host_checks says so), or a finite stack
    return warn("stack", f"the stack size is unlimited (`ulimit -s unlimited`) on {spec.name}; "
                "NCCL's documentation warns against it. Set a finite one, e.g. `ulimit -s "
                "8192` in `setup:`.",
                "stack size unlimited, which NCCL's documentation warns against; set e.g. "
                "`ulimit -s 8192` in `setup:`")


def active_ports(facts: HostFacts) -> list[str]:
    """`mlx5_0:1`-style names of the RDMA ports that are ACTIVE."""
    found = facts.infiniband or {}
    return [f"{dev}:{port}" for dev, ports in sorted(found.items())
            for port, item in sorted(ports.items()) if item.active]


def ib_hca(spec: HostSpec, facts: HostFacts) -> Optional[str]:
    """NCCL_IB_HCA as the ranks will see it: the inventory's, else this shell's (forwarded),
    else the host's own environment."""
    sources: tuple[Mapping[str, str], ...] = (dict(spec.env), os.environ, facts.env)
    for source in sources:
        if "NCCL_IB_HCA" in source:
            return source["NCCL_IB_HCA"]
    return None


def _rdma(spec: HostSpec, facts: HostFacts, limits: Limits) -> list[Check]:
    if facts.infiniband is None:  # {}: the probe looked, and there is no RDMA stack
        return [warn("infiniband", f"RDMA devices unknown on {spec.name}: the probe did not "
                     "report them, so InfiniBand/RoCE, locked memory and NCCL_IB_HCA were not "
                     "checked (`ibstat` there says).", "RDMA devices unknown: the probe did not "
                     "report them, so they were not checked")]
    devices = facts.infiniband
    out: list[Check] = []
    hca = ib_hca(spec, facts)
    if devices:
        active = active_ports(facts)
        if not active:
            out.append(warn("infiniband", f"{spec.name} has RDMA devices ({', '.join(devices)}) "
                            "but no ACTIVE port: NCCL will use TCP sockets there. Check the "
                            "cables and the subnet manager (ibstat).",
                            "RDMA devices but no ACTIVE port; NCCL falls back to sockets"))
        else:
            out.append(Check("infiniband", True, ", ".join(
                f"{p} {port_info(facts, p).link_layer} {port_info(facts, p).rate}"
                for p in active)))
        if limits.memlock is None:
            out.append(warn("memlock", f"locked memory is unknown on {spec.name}, which has "
                            "RDMA devices: the probe did not report it, so it was not checked. "
                            "NCCL needs it unlimited there (`ulimit -l`).", "locked memory "
                            "unknown with RDMA devices present, so it was not checked"))
        elif (memlock := limits.memlock.soft) is not None:
            text = (f"locked memory is limited to {_size(memlock)} on {spec.name}, which has "
                    "RDMA devices: NCCL cannot register its buffers for InfiniBand/RoCE. Set "
                    "`ulimit -l unlimited` (/etc/security/limits.conf, or the container's "
                    "--ulimit memlock=-1).")
            out.append(Check("memlock", False, text, "locked memory limited with RDMA "
                             "devices present; set `ulimit -l unlimited`")
                       if memlock < MEMLOCK_FAIL else warn("memlock", text))
    if hca and not hca.startswith("^"):
        exact = hca.startswith("=")
        for entry in hca.lstrip("=").split(","):
            dev = entry.split(":")[0].strip()
            if not dev:
                continue
            hit = [d for d in devices if (d == dev if exact else d.startswith(dev))]
            if not hit:
                have = ", ".join(devices) or "none"
                check = Check("nccl_ib_hca", False, f"NCCL_IB_HCA={hca} names {dev!r}, which "
                              f"{spec.name} does not have (its RDMA devices: {have}). Name "
                              "devices from /sys/class/infiniband, or unset it.")
                out.append(check if devices else warn(
                    "nccl_ib_hca", f"NCCL_IB_HCA={hca} is set but {spec.name} has no RDMA "
                    "devices; NCCL will use TCP sockets there.",
                    f"NCCL_IB_HCA={hca} is set, but no RDMA devices here; NCCL uses TCP "
                    "sockets"))
                break
    return out


def port_info(facts: HostFacts, name: str) -> IbPort:
    dev, port = name.split(":")
    return (facts.infiniband or {}).get(dev, {}).get(port, IbPort())
