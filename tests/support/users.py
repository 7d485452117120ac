"""Normal (non-root) users on the sandbox's hosts, to try clusterrun as one, and a Python they
can run.

The hosts share this machine's /etc/passwd and /home, so one `useradd` makes the user on all of
them; each host's sshd gives every user the sandbox's key (clusterrun/sandbox/sshd.py), so a
user needs no home of its own to log in.

A user other than the one who built the venv may not be able to run it: a venv's `python`
links to the interpreter it was made from, and that is often a pyenv or conda build under a
home of mode 700. `shared_python` gives such a user an interpreter of its own instead of
opening anyone's home.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import clusterrun
from clusterrun.errors import SandboxError
from clusterrun.sandbox.cluster import Sandbox

# The machine's own interpreter: every user may run it (pyenv's and conda's live under a home).
SYSTEM_PYTHON = "/usr/bin/python3"


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


def shared_python(dest: Path, base: str = SYSTEM_PYTHON) -> Path:
    """A venv at ``dest`` (new or empty; opened to every user) made from ``base``, holding the
    packages of the interpreter running this and this checkout's clusterrun; its python.

    The packages are hard links (copies across filesystems), so torch costs no disk and no
    time. ``base`` must be the same Python version as this one, since compiled extensions
    (torch's, cryptography's) are built for one version.
    """
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    try:
        theirs = subprocess.run(
            [base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"cannot run {base} to give other users a Python: {exc}") from exc
    if theirs != ours:
        raise SandboxError(
            f"{base} is Python {theirs} but this interpreter is {ours}: the packages cannot be "
            f"shared between them. Make the venv from {base} (`{base} -m venv .venv`).")
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True,
                   capture_output=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    source = Path(sysconfig.get_path("purelib"))
    for entry in source.iterdir():
        # An editable install points into the checkout, which the user may not enter: the
        # package itself is copied below instead.
        if entry.name.startswith(("__editable__", "clusterrun")) or entry.name == "__pycache__":
            continue
        _link_tree(entry, site / entry.name)
    shutil.copytree(Path(clusterrun.__file__).parent, site / "clusterrun",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # A clone made under a umask of 077 has files only its owner may read.
    for folder, _dirs, files in os.walk(site / "clusterrun"):
        os.chmod(folder, 0o755)  # for every user: that is its purpose
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return dest / "bin" / "python"


def _link_tree(source: Path, target: Path) -> None:
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(source), str(target))


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM):
            raise
        shutil.copy2(source, target, follow_symlinks=False)
