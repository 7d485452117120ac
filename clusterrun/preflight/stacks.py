"""Can `clusterrun stacks` (and the stall report) read the ranks' stacks on a host? py-spy needs
ptrace permission over the ranks: root, CAP_SYS_PTRACE, or Yama's ptrace_scope 0 or 1 (at 1,
the ranks opt in through rank.sh: PR_SET_PTRACER_ANY). At 2 or 3 a normal user cannot."""

from __future__ import annotations

from typing import Any, Optional

from clusterrun.inventory import HostSpec
from clusterrun.preflight.report import Check, warn


def host_checks(spec: HostSpec, facts: dict[str, Any]) -> list[Check]:
    found = _check(spec, facts.get("ptrace"))
    return [found] if found is not None else []


def _check(spec: HostSpec, ptrace: Optional[dict[str, Any]]) -> Optional[Check]:
    if not isinstance(ptrace, dict):
        text = ("whether `clusterrun stacks` and the stall report can read the ranks' stacks "
                "there is unknown: the probe did not report the ptrace permissions, so they "
                "were not checked (`sysctl kernel.yama.ptrace_scope` there says).")
        return warn("stacks", f"{spec.name}: {text}", text)
    if ptrace.get("cap_sys_ptrace"):
        return None  # allowed whatever else holds
    scope = ptrace.get("scope")
    if spec.container:
        # docker's and podman's default seccomp profiles allow process_vm_readv (how py-spy
        # reads a process) only with CAP_SYS_PTRACE, even for root in the container.
        why, fix = ("the container lacks CAP_SYS_PTRACE",
                    "start the container with `--cap-add SYS_PTRACE` (docker, podman)")
    elif ptrace.get("root") or scope in (None, 0, 1):
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
