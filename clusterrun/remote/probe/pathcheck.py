"""Why a directory on a host cannot be used (stdlib only, Python 3.6+; shipped with probe.py and
files.py): the facts the controller needs to say what is in the way and what to change
(clusterrun/preflight/hostpaths.py words them).

An OSError alone names one path and a strerror: "No such file or directory: '/home/alice'" says
neither that alice has no home directory there nor that `workdir:` is the fix.
"""

import errno
import os


def _user():
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return None


def nearest_existing(path):
    """The longest leading part of ``path`` that exists (as a link, too): what stands in the
    way when it is a file, or what the user may not write to when it is a directory."""
    here = path
    while not os.path.lexists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    return here


def failure(path, exc):
    """``path`` (absolute) could not be created or written: ``exc`` and what surrounds it."""
    existing = nearest_existing(path)
    is_dir = os.path.isdir(existing)
    home = os.path.expanduser("~")
    code = getattr(exc, "errno", None)
    return {
        "path": path, "ok": False, "error": getattr(exc, "strerror", None) or str(exc),
        "errno": errno.errorcode.get(code) if code else None,
        "failed_at": exc.filename if isinstance(getattr(exc, "filename", None), str) else None,
        "existing": existing, "existing_is_dir": is_dir,
        "writable": os.access(existing, os.W_OK | os.X_OK) if is_dir else False,
        "user": _user(), "home": home, "home_exists": os.path.isdir(home),
    }
