"""The host's own interpreter (the inventory's `python:`) as an `environment:` built with
`system_site_packages: true` sees it (stdlib only, Python 3.6+; used by pyenv.py).

uv builds the environment on the base of the interpreter it is given: where `python:` is itself a
virtual environment (a GPU image's /opt/venv holding torch), `--system-site-packages` shows the
base's packages and not that environment's. ``keep_host`` then writes a .pth into the built
environment that adds the host environment's own site directories after the environment's own
(the lock's packages come first), their .pth files included. A conda environment's interpreter is
a prefix of its own, not a virtual environment: its site-packages is already the built
environment's system site directory, and nothing is added.

The interpreter is asked in a process of its own, with its site module: pyenv.py runs with -S,
under which a virtual environment's sys.prefix is its base's (site.py is what reads pyvenv.cfg's
prefix; seen on 3.11 too), and may run in the built environment's interpreter instead.
"""

import json
import os
import shutil
import subprocess

from clusterrun.remote.probe import envstate

PTH = "_clusterrun_host.pth"
ASK_SECONDS = 60

_ASK = ("import json, site, sys\n"
        "dirs = site.getsitepackages() if hasattr(site, 'getsitepackages') else []\n"
        "print(json.dumps({'prefix': sys.prefix, 'executable': sys.executable,\n"
        "                  'base': getattr(sys, 'base_prefix', sys.prefix),\n"
        "                  'site': dirs, 'path': sys.path}))\n")


class AskFailed(Exception):
    """The host's interpreter could not be found or asked."""


def resolve(python):
    """``python`` as a path: a bare name looked up on PATH, as the host's shell would."""
    if os.sep in python:
        return os.path.abspath(os.path.expanduser(python))
    found = shutil.which(python)
    if found is None:
        raise AskFailed("the host's `python:` %r is not on PATH" % python)
    return found


def ask(python):
    """What ``python``, started with its site module, says of itself: prefix, base prefix, site
    directories and sys.path. PYTHONPATH is left out: it is no package of that interpreter's."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run([python, "-c", _ASK], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, cwd="/", timeout=ASK_SECONDS,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AskFailed("asking %s for its site-packages failed: %s" % (python, exc)) from None
    if proc.returncode != 0:
        said = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise AskFailed("asking %s for its site-packages failed (exit %d): %s"
                        % (python, proc.returncode, " | ".join(said)))
    return json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])


def _unique(dirs):
    seen, out = set(), []
    for path in dirs:
        real = os.path.realpath(path)
        if path and real not in seen and os.path.isdir(path):
            seen.add(real)
            out.append(path)
    return out


def own_site_dirs(found):
    """The site directories a virtual environment holds itself (not its base's, which the built
    environment sees already); none for a base interpreter or a conda environment."""
    prefix = os.path.realpath(found["prefix"])
    if prefix == os.path.realpath(found["base"]):
        return []
    inside = os.path.join(prefix, "")
    return _unique(d for d in found["site"] if os.path.realpath(d).startswith(inside))


def _pth(env):
    """Where the built environment ``env`` keeps its .pth of the host's directories."""
    lib = os.path.join(env, "lib")
    with_site = [os.path.join(lib, entry, "site-packages") for entry in sorted(os.listdir(lib))
                 if entry.startswith("python")] if os.path.isdir(lib) else []
    with_site = [s for s in with_site if os.path.isdir(s)]
    if not with_site:
        raise AskFailed("the environment built in %s has no site-packages" % env)
    return os.path.join(with_site[0], PTH)


def _body(dirs):
    # Python source, not a shell: repr() is the literal that names each path exactly.
    return "".join("import site; site.addsitedir(%r)\n" % d for d in dirs)


def keep_host(env, dirs):
    """The host environment's own site directories ``dirs`` (own_site_dirs) added to the built
    environment ``env``, after its own: a .pth in env's site-packages."""
    if dirs:
        with open(_pth(env), "w") as out:
            out.write(_body(dirs))


def kept(env, dirs):
    """Whether the built environment ``env`` adds exactly ``dirs``: not where it was built
    before its host's `python:` was a virtual environment, or by a clusterrun that did not add
    them, or when that virtual environment's directories moved."""
    try:
        with open(_pth(env)) as handle:
            return handle.read() == _body(dirs)
    except AskFailed:
        return False
    except OSError:
        return not dirs


def distributions(path):
    """{canonical name: version} of the distributions found on ``path`` (sys.path), the first
    of a name winning as imports do."""
    found = {}
    for folder in _unique(p for p in path if p):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for item in names:
            dist = envstate.dist_of(item)
            if dist is not None:
                found.setdefault(*dist)
    return found
