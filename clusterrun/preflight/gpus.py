"""What preflight decides about GPUs from the facts the hosts reported
(clusterrun/remote/probe/nvidia.py): per host, the GPUs this run will use; across hosts, the NVIDIA
driver. Pure functions.

``facts["nvidia"]``, as the probe reports it::

    {"smi": "/usr/bin/nvidia-smi" | None,      # None: no nvidia-smi on the PATH (a CPU host)
     "count": 8,                                # GPUs nvidia-smi sees (`-L` when queries fail)
     "driver": "550.54.15" | None,
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
               "driver": "550.54.15", "memory_used": 3, "memory_total": 81559,  # MiB
               "compute_mode": "Default", "ecc_uncorrected": 0,
               "retired_pages_pending": False, "remap_pending": False,
               "remap_failure": False}],       # any value None: this driver/GPU cannot say
     "apps": [{"gpu": 0, "gpu_uuid": "GPU-...", "pid": 4242, "used_memory": 1000,
               "process_name": "python", "uid": 65534, "user": "nobody",
               "visible": True,                 # False: the pid is in another PID namespace
               "mine": False}],                 # the probe's own user (None: unknown)
     "errors": {"remapped_rows": "nvidia-smi exited 2: ..."}}  # per query that failed

Decisions:
- A GPU of this run that holds compute processes, or more than BUSY_MIB of memory, fails the host
  whoever owns them. Processes of the user clusterrun runs as fail it too: they are nearly
  always a leftover of an earlier run, and the memory is gone all the same (nccl#582: an OOM at
  init, then the other ranks hang in NCCL). The message names them, so the fix is one `kill`.
- Compute mode other than Default, uncorrected ECC errors since the driver loaded, pending page
  retirement or row remapping (and a failed remap): failures; the GPU needs a reset or service.
- `--allow-busy-gpus` turns every failure here into a warning: the user has been told and goes on.
- The driver version differing from the master's is a warning: NCCL needs the same NCCL and CUDA
  runtime on every host (compared with torch), not the same kernel driver; a driver too old for
  torch's CUDA fails at CUDA initialisation on that host with its own clear message.
- No nvidia-smi: nothing GPU-related fails (a CPU host, or the controller's laptop).
- No `nvidia` facts at all: a warning that the GPUs are unknown; only the count is checked.
"""

from __future__ import annotations

from typing import Optional

from clusterrun.inventory import HostSpec
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.gpu_facts import GpuApp, NvidiaFacts, NvidiaGpu
from clusterrun.preflight.report import Check, HostReport

# Memory an idle GPU, or one that also drives a desktop, shows as used without any compute job.
BUSY_MIB = 1024

ALLOW = "--allow-busy-gpus"


def _verdict(name: str, detail: str, fix: str, allow: bool) -> Check:
    if allow:
        return Check(name, True, f"warning: {detail} Going on anyway ({ALLOW}).")
    return Check(name, False, f"{detail} {fix}")


def _indices(items: list[int], sep: str = ", ") -> str:
    return sep.join(str(i) for i in items)


def used_gpus(spec: HostSpec, count: int) -> list[int]:
    """The nvidia-smi indices this run's ranks will use on the host: `gpus:` (those that exist),
    else the first nproc_per_node when it is a number (local rank k takes cuda:k), else all.
    CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi by PCI bus;
    on the identical GPUs of a training machine both orders agree."""
    if spec.gpus is not None:
        return [g for g in spec.gpus if g < count]
    if isinstance(spec.nproc_per_node, int) and spec.nproc_per_node < count:
        return list(range(spec.nproc_per_node))
    return list(range(count))


def host_checks(spec: HostSpec, facts: HostFacts, *,
                allow_busy_gpus: bool = False) -> list[Check]:
    """One host's GPU checks: a `gpus` summary, then one check per kind of problem found."""
    nvidia, count = facts.nvidia, facts.gpus
    if nvidia is not None and not nvidia.smi:
        return [_no_gpus(spec, " (no nvidia-smi on the PATH)")]
    if nvidia is not None and "gpus" in nvidia.errors:
        return [_smi_failed(spec, nvidia, count, allow_busy_gpus)]
    if nvidia is None:  # only a count: whether the GPUs are free and healthy is unknown
        return [_unknown(spec, count), *_count_checks(spec, count, allow_busy_gpus)]
    summary = _summary(spec, nvidia, count) if count else Check(
        "gpus", True, f"warning: nvidia-smi on {spec.name} lists no GPU; its ranks will run "
        "without one (`nvidia-smi -L` there; a GPU that fell off the bus needs a reboot).")
    checks = [summary, *_count_checks(spec, count, allow_busy_gpus)]
    by_index = {g.index: g for g in nvidia.gpus}
    used = [by_index[i] for i in used_gpus(spec, count) if i in by_index]
    busy = _busy(spec, used, nvidia.apps)
    if busy:
        checks.append(_verdict("gpu_busy", busy, "Stop those processes, pick other GPUs with "
                               f"`gpus:` in the inventory, or pass {ALLOW} to go on.",
                               allow_busy_gpus))
    odd = [g for g in used if g.compute_mode not in (None, "Default")]
    if odd:
        checks.append(_verdict("gpu_mode", _modes(spec, odd), "Set it back to Default as root "
                               f"(`nvidia-smi -i {_indices([g.index for g in odd], ',')} "
                               f"-c DEFAULT`), pick other GPUs with `gpus:`, or pass {ALLOW} to "
                               "go on.", allow_busy_gpus))
    sick = {g.index: _ailments(g) for g in used if _ailments(g)}
    if sick:
        checks.append(_verdict("gpu_health", _health(spec, sick), "Reset the GPU with nothing "
                               f"running on it (`nvidia-smi -r -i {_indices(list(sick), ',')}` "
                               "as root) or reboot the host, and have it serviced if that "
                               f"recurs; or pick other GPUs with `gpus:`, or pass {ALLOW} to go "
                               "on.", allow_busy_gpus))
    return checks


def _unknown(spec: HostSpec, count: int) -> Check:
    why = "the probe sent no nvidia-smi details, so that was not checked (`nvidia-smi` there)"
    if not count:
        return Check("gpus", True, f"warning: whether {spec.name} has NVIDIA GPUs is unknown: "
                     f"{why}.", f"warning: whether it has NVIDIA GPUs is unknown: {why}")
    used = _summary(spec, None, count).detail
    return Check("gpus", True, f"warning: {used}; whether they are free and healthy is "
                 f"unknown: {why}.", f"warning: {used}; whether they are free and healthy is "
                 f"unknown: {why}")


def _no_gpus(spec: HostSpec, why: str) -> Check:
    if spec.gpus is not None:
        return Check("gpus", True, f"warning: `gpus: {list(spec.gpus)}` but no NVIDIA GPU was "
                     f"found on {spec.name}{why}; its ranks will run without a GPU.")
    return Check("gpus", True, f"no NVIDIA GPU found{why}")


def _smi_failed(spec: HostSpec, nvidia: NvidiaFacts, count: int, allow: bool) -> Check:
    listed = f" (`nvidia-smi -L` lists {count} GPU(s))" if count else ""
    return _verdict("gpus", f"nvidia-smi fails on {spec.name}{listed}: "
                    f"{nvidia.errors['gpus']}. CUDA will fail the same way there.",
                    "A driver/library version mismatch after a driver upgrade needs a reboot "
                    f"(or the nvidia kernel modules reloaded); or pass {ALLOW} to go on.", allow)


def _summary(spec: HostSpec, nvidia: Optional[NvidiaFacts], count: int) -> Check:
    used = used_gpus(spec, count)
    which = "all" if spec.gpus is None and len(used) == count else _indices(used)
    detail = f"{len(used)} of {count} GPU(s) used ({which})"
    if nvidia is not None:
        names = sorted({g.name for g in nvidia.gpus if g.name})
        if names:
            detail += f", {', '.join(names)}"
        if nvidia.driver:
            detail += f", driver {nvidia.driver}"
        missing = sorted(k.replace("_", " ") for k in nvidia.errors)
        if missing:
            detail += f"; nvidia-smi could not report: {', '.join(missing)}"
    return Check("gpus", True, detail)


def _count_checks(spec: HostSpec, count: int, allow: bool) -> list[Check]:
    checks = []
    if spec.gpus is not None and max(spec.gpus) >= count:
        missing = [g for g in spec.gpus if g >= count]
        have = f"indices 0-{count - 1}" if count else "none"
        checks.append(_verdict(
            "gpu_count", f"`gpus: {list(spec.gpus)}` but {spec.name} has {count} GPU(s) "
            f"({have}): GPU {_indices(missing)} does not exist, and CUDA ignores "
            "CUDA_VISIBLE_DEVICES from the first index that does not, so ranks would fail with "
            "'invalid device ordinal'.", "Fix `gpus:` for that host.", allow))
    visible = len(spec.gpus) if spec.gpus is not None else count
    if isinstance(spec.nproc_per_node, int) and count and spec.nproc_per_node > visible:
        checks.append(Check("gpu_count", True, f"warning: nproc_per_node {spec.nproc_per_node} "
                            f"but {visible} GPU(s) visible on {spec.name}: ranks with a local "
                            f"rank of {visible} or more have no GPU of their own "
                            "(torch.cuda.set_device(local_rank) fails). Lower nproc_per_node, "
                            "or use `auto`."))
    return checks


def _process(app: GpuApp) -> str:
    """pid, name, whose, how much: one process on a GPU, as the user will go looking for it."""
    pid, what = app.pid, f"pid {app.pid} {app.process_name or '?'}"
    memory = _mib(app.used_memory)
    if not app.visible:
        return (f"{what} ({memory}) of an unknown user: that pid is not visible on the host "
                "(another PID namespace, such as a container)")
    if app.mine:
        return (f"{what} ({memory}) of {app.user}, the user clusterrun runs as there: "
                f"a leftover of an earlier run? `kill {pid}`")
    return f"{what} ({memory}) of user {app.user}"


def _busy(spec: HostSpec, used: list[NvidiaGpu], apps: tuple[GpuApp, ...]) -> str:
    found = []
    for gpu in used:
        mine = [a for a in apps if a.gpu == gpu.index]
        memory = gpu.memory_used
        if not mine and (memory is None or memory <= BUSY_MIB):
            continue
        of = f" of {gpu.memory_total} MiB" if gpu.memory_total else ""
        held = f"{memory} MiB{of} in use" if memory is not None else "in use"
        if mine:
            found.append(f"GPU {gpu.index}: {held} by {', '.join(map(_process, mine))}")
        else:
            found.append(f"GPU {gpu.index}: {held}, by no process nvidia-smi shows here "
                         "(another container or PID namespace)")
    if not found:
        return ""
    return (f"{spec.name} {'; '.join(found)}. This run needs those GPUs: it would run out of "
            "memory at start-up, or hang in NCCL init.")


def _mib(value: Optional[int]) -> str:
    return "memory unknown" if value is None else f"{value} MiB"


def _modes(spec: HostSpec, odd: list[NvidiaGpu]) -> str:
    modes = {g.compute_mode for g in odd}
    why = []
    if modes - {"Prohibited"}:
        why.append("an Exclusive mode admits one CUDA process per GPU, so a second one (or "
                   "anything already there) fails with 'all CUDA-capable devices are busy or "
                   "unavailable'")
    if "Prohibited" in modes:
        why.append("Prohibited admits no CUDA process at all")
    states = "; ".join(f"GPU {g.index} is in compute mode {g.compute_mode}" for g in odd)
    return f"{spec.name} {states}: {', and '.join(why)}."


def _ailments(gpu: NvidiaGpu) -> list[str]:
    what = []
    if (gpu.ecc_uncorrected or 0) > 0:
        what.append(f"{gpu.ecc_uncorrected} uncorrected ECC error(s) since the driver loaded")
    if gpu.retired_pages_pending:
        what.append("memory pages pending retirement")
    if gpu.remap_pending:
        what.append("a row remapping pending")
    if gpu.remap_failure:
        what.append("a failed row remapping")
    return what


def _health(spec: HostSpec, sick: dict[int, list[str]]) -> str:
    found = "; ".join(f"GPU {index}: {', '.join(what)}" for index, what in sick.items())
    return (f"{spec.name} {found}. Until the GPU is reset its memory is unreliable: wrong "
            "results, or a crash mid-run.")


def driver(report: HostReport) -> Optional[str]:
    nvidia = report.known.nvidia
    return (nvidia.driver if nvidia is not None else None) or None


def compare_drivers(reports: list[HostReport]) -> None:
    """The NVIDIA driver of every host against the master's (the first GPU host's when the
    master has none): a difference is a warning (see the module's notes)."""
    found = [(r, driver(r)) for r in reports]
    with_driver = [(r, d) for r, d in found if d]
    if not with_driver:
        return
    ref, want = next(((r, d) for r, d in with_driver if r.spec.master), with_driver[0])
    where = f"the master {ref.spec.name}" if ref.spec.master else ref.spec.name
    why = ("NCCL needs the same NCCL and CUDA runtime on every host (see torch), not the same "
           "driver, but a driver older than torch's CUDA fails at start-up there; install the "
           "same driver everywhere to rule that out.")
    for r, have in with_driver:
        if have != want:
            # `group`: hosts with the same other driver are reported together in one line.
            r.add("gpu_driver", True, f"warning: NVIDIA driver {have} on {r.spec.name} but "
                  f"{want} on {where}. {why}", f"warning: NVIDIA driver {have}, but "
                  f"{want} on {where}. {why}")
