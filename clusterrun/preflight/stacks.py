"""Can `clusterrun stacks` (and the stall report) read the ranks' stacks on a host? py-spy needs
ptrace permission over the ranks: root, CAP_SYS_PTRACE, or Yama's ptrace_scope 0 or 1 (at 1,
the ranks opt in through rank.sh: PR_SET_PTRACER_ANY). At 2 or 3 a normal user cannot. And a
py-spy must exist for the host: its own, or the controller's shipped to a host of the same
machine type (pip has py-spy for Linux x86_64 and aarch64 only)."""

from __future__ import annotations

from typing import Optional

from clusterrun import pyspy
from clusterrun.inventory import HostSpec
from clusterrun.preflight.facts import HostFacts, Ptrace
from clusterrun.preflight.report import Check, warn


def host_checks(spec: HostSpec, facts: HostFacts) -> list[Check]:
    found = [_check(spec, facts.ptrace), _binary(spec, facts.ptrace)]
    return [check for check in found if check is not None]


def _binary(spec: HostSpec, ptrace: Optional[Ptrace]) -> Optional[Check]:
    """No py-spy there and none that could be shipped: the host's ranks cannot be read."""
    if ptrace is None or ptrace.machine is None or ptrace.pyspy:
        return None  # an older probe, or the host's own py-spy
    machine = ptrace.machine
    local = pyspy.local()
    # The probe runs only on Linux hosts (DESIGN: hosts are Linux); its uname system is that.
    if local is not None and local.fits("Linux", machine):
        return None
    why = (f"this machine has no py-spy to send ({pyspy.INSTALL} here)" if local is None
           else f"this machine's py-spy ({local.path}) is {local.describe()}")
    text = (f"no py-spy for this host ({machine}): {why}, and the host has none of its own; "
            "`clusterrun stacks`, `--profile` and the stall report cannot read its ranks (the "
            "watchdog there counts growing CPU as progress). Fix: install py-spy in the host's "
            f"Python environment ({pyspy.INSTALL}; pip has it for Linux x86_64 and aarch64), "
            "or put a py-spy built for it on its PATH.")
    return warn("stacks", f"{spec.name}: {text}", text)


def _check(spec: HostSpec, ptrace: Optional[Ptrace]) -> Optional[Check]:
    if ptrace is None:
        text = ("whether `clusterrun stacks` and the stall report can read the ranks' stacks "
                "there is unknown: the probe did not report the ptrace permissions, so they "
                "were not checked (`sysctl kernel.yama.ptrace_scope` there says).")
        return warn("stacks", f"{spec.name}: {text}", text)
    if ptrace.cap_sys_ptrace:
        return None  # allowed whatever else holds
    scope = ptrace.scope
    if spec.container:
        # docker's and podman's default seccomp profiles allow process_vm_readv (how py-spy
        # reads a process) only with CAP_SYS_PTRACE, even for root in the container.
        why, fix = ("the container lacks CAP_SYS_PTRACE",
                    "start the container with `--cap-add SYS_PTRACE` (docker, podman)")
    elif ptrace.root or scope in (None, 0, 1):
        return None
    elif scope == 2:
        why, fix = ("kernel.yama.ptrace_scope is 2 and the user has no CAP_SYS_PTRACE",
                    "`sudo sysctl kernel.yama.ptrace_scope=1` there (clusterrun's ranks then "
                    "let their own user read them)")
    else:
        why, fix = (f"kernel.yama.ptrace_scope is {scope}: no process may be traced",
                    "only a reboot lowers scope 3; nothing clusterrun can do there")
    text = (f"`clusterrun stacks` and the stall report cannot read the ranks' stacks there: "
            f"{why}. Fix: {fix}.")
    return warn("stacks", f"{spec.name}: {text}", text)  # the same words for every such host
