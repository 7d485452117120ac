"""What this machine needs to host a sandbox, said as the fix: Linux, root, network
namespaces, sshd and the tools the hosts are built with."""

from __future__ import annotations

import os
import shutil
import sys

from clusterrun.errors import SandboxError
from clusterrun.sandbox import sshd


def require_support() -> None:
    """Raise SandboxError saying exactly what to do when this machine cannot host a sandbox."""
    if not sys.platform.startswith("linux"):
        raise SandboxError(
            f"clusterrun sandbox needs Linux network namespaces, and this is {sys.platform}. "
            "Run it on a Linux machine or VM where you are root."
        )
    problems = []
    if os.geteuid() != 0:
        problems.append("it must run as root (it creates network namespaces and bridges and "
                        "starts sshd): rerun it with sudo")
    if not os.path.exists("/proc/self/ns/net"):
        problems.append("this kernel has no network namespaces (CONFIG_NET_NS)")
    if not os.access(sshd.SSHD, os.X_OK):
        problems.append(f"{sshd.SSHD} is missing: `apt-get install openssh-server`")
    for tools, package in (
        (("ip",), "iproute2"), (("unshare", "nsenter", "mount"), "util-linux"),
        (("ssh-keygen",), "openssh-client"),
    ):
        missing = [tool for tool in tools if shutil.which(tool) is None]
        if missing:
            problems.append(f"{'/'.join(missing)} missing: `apt-get install {package}`")
    if problems:
        raise SandboxError("clusterrun sandbox cannot run here: " + "; ".join(problems) + ".")
