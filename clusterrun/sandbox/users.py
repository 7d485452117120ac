"""A normal (non-root) user on every sandbox host, to try clusterrun as one: the hosts share
this machine's /etc/passwd and /home, so one `useradd` makes the user on all of them, and the
sandbox's key in its ~/.ssh/authorized_keys lets it log in to each (sshd reads that file as
the user; the sandbox's own folder stays closed to it)."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid

from clusterrun.sandbox.cluster import Sandbox


def add(sb: Sandbox, name: str | None = None) -> str:
    """Create the user (``crsu<hex>`` by default), its home under /home."""
    name = name or f"crsu{uuid.uuid4().hex[:8]}"
    # `*` is no password (not a locked account, which sshd without PAM refuses).
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-p", "*", name], check=True,
                   capture_output=True)
    user = pwd.getpwnam(name)
    ssh = os.path.join(user.pw_dir, ".ssh")
    os.makedirs(ssh, mode=0o700, exist_ok=True)
    keys = os.path.join(ssh, "authorized_keys")
    with open(keys, "w", encoding="utf-8") as handle:
        handle.write(sb.identity_file.with_suffix(".pub").read_text())
    for path in (ssh, keys):
        os.chown(path, user.pw_uid, user.pw_gid)
    return name


def remove(name: str) -> None:
    subprocess.run(["userdel", "-r", "-f", name], check=False, capture_output=True)
