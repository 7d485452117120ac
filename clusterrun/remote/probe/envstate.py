"""A host's `environment:` as built there (stdlib only, Python 3.6+): what pyenv.py's status
and the preflight probe report of ``<workdir>/envs/<lock hash>``, so that the controller can tell
a host whose environment is the lock's (envs/verify.py) from the probe's facts alone."""

import contextlib
import os
import re
import sys


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_of(item):
    """(canonical name, version) of a site directory's ``NAME-VERSION.dist-info`` (or
    .egg-info) entry; None for anything else."""
    for suffix in (".dist-info", ".egg-info"):
        if item.endswith(suffix) and "-" in item:
            name, _, version = item[:-len(suffix)].partition("-")
            return canonical(name), version.split("-")[0]
    return None


def distributions(env):
    """``name==version`` of every distribution installed in the environment's own folder."""
    found = []
    for lib in ("lib", "lib64"):
        base = os.path.join(env, lib)
        with contextlib.suppress(OSError):
            for entry in os.listdir(base):
                site = os.path.join(base, entry, "site-packages")
                if not entry.startswith("python") or not os.path.isdir(site):
                    continue
                for item in os.listdir(site):
                    dist = dist_of(item)
                    if dist is not None:
                        found.append("%s==%s" % dist)
        if found:
            break
    return sorted(set(found))


def interpreter(env):
    """The environment's Python version, from its pyvenv.cfg."""
    cfg = _read(os.path.join(env, "pyvenv.cfg"))
    for line in (cfg or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            return value.strip()
    return None


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def describe(env):
    if not os.path.isfile(os.path.join(env, "pyvenv.cfg")):
        return None
    return {"path": env, "python": interpreter(env), "dists": distributions(env)}


def state(workdir, lock):
    """The host's platform (Python, CPU, glibc), its absolute workdir, and the lock's
    environment there (None when not built): the part of pyenv.py's status that needs no
    request beyond the workdir and the lock's hash."""
    workdir = os.path.abspath(os.path.expanduser(workdir))
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names \
        else None
    return {"python": "%d.%d.%d" % sys.version_info[:3], "machine": os.uname()[4],
            "system": os.uname()[0], "libc": libc, "workdir": workdir,
            "env": describe(os.path.join(workdir, "envs", lock))}
