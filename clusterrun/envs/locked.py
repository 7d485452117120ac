"""The wheels a lock says where to find (uv.lock's `path` and `url` wheels, a requirements line's
`name @ URL`): the one that installs on a host's platform chosen by its tags, best first as pip
and uv rank them, and taken from there on this machine.

What the lock names is exact, so nothing is resolved: pip is asked only for a pin the lock gives
no wheel of for the platform, or whose wheel cannot be taken from where the lock says
(envs/wheels.py). A wheel of the same file name in the inventory's `find_links:` is taken first,
so that a mirror on this machine spares a download; the lock's sha256 is checked either way.
"""

from __future__ import annotations

import contextlib
import shutil
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from clusterrun.envs import credentials
from clusterrun.envs.platforms import Platform
from clusterrun.inventory.pylock import LockedWheel, Pin

FETCH_SECONDS = 120.0  # without a byte: a link that moves nothing
BLOCK = 1 << 20


class Unavailable(Exception):
    """The wheel is not where the lock says, or could not be fetched from there: why (the
    message), and what fixes it where there is more to say than `find_links:` (``fix``)."""

    def __init__(self, reason: str, fix: str = "") -> None:
        super().__init__(reason)
        self.fix = fix


def choose(pin: Pin, platform: Platform) -> Optional[LockedWheel]:
    """The lock's wheel of ``pin`` that installs on ``platform``, the best tag first; None when
    none does."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    ranks = {tag: rank for rank, tag in reversed(list(enumerate(platform.wheel_tags())))}
    best: Optional[tuple[int, LockedWheel]] = None
    for wheel in pin.files:
        try:
            tags = parse_wheel_filename(wheel.filename)[3]
        except InvalidWheelFilename:
            continue
        found = [ranks[key] for t in tags if (key := (t.interpreter, t.abi, t.platform)) in ranks]
        if found and (best is None or min(found) < best[0]):
            best = (min(found), wheel)
    return best[1] if best else None


def listed(pin: Pin) -> str:
    """The platforms the lock has wheels of ``pin`` for, in a few words, for messages."""
    names = [w.filename for w in pin.files]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def take(wheel: LockedWheel, links: Sequence[str], folder: Path) -> Path:
    """``wheel`` copied or downloaded into ``folder`` under its file name, or Unavailable."""
    target = folder / wheel.filename
    for link in links:
        candidate = Path(link) / wheel.filename
        if candidate.is_file():
            shutil.copyfile(candidate, target)
            return target
    if wheel.is_url:
        _download(wheel, target)
        return target
    try:
        shutil.copyfile(wheel.location, target)
    except FileNotFoundError:
        raise Unavailable(f"the lock's wheel {wheel.location} is not there",
                          "Put it back, or lock again where it is.") from None
    except OSError as exc:
        raise Unavailable(f"the lock's wheel {wheel.location} cannot be read "
                          f"({exc.strerror or exc})") from None
    return target


def _download(wheel: LockedWheel, target: Path) -> None:
    url = wheel.location
    shown = credentials.strip(url)
    found = credentials.lookup(url, wheel.index_url, wheel.index_name)
    ask = urllib.request.Request(shown)  # noqa: S310 - http(s) only: LockedWheel.is_url
    for key, value in credentials.header(found).items():
        ask.add_unredirected_header(key, value)  # a redirect elsewhere does not carry it
    opener = urllib.request.build_opener(_SameRealmRedirect(shown, found))
    try:
        with contextlib.closing(opener.open(ask, timeout=FETCH_SECONDS)) as answer, \
                target.open("wb") as out:
            for block in iter(lambda: answer.read(BLOCK), b""):
                out.write(block)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            given = "the credentials given were refused" if found else \
                "no credentials were found for it"
            raise Unavailable(f"the lock's {shown} answered HTTP {exc.code} {exc.reason}, and "
                              f"{given}", _credentials_fix(wheel)) from None
        raise Unavailable(f"the lock's {shown} answered HTTP {exc.code} {exc.reason}") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise Unavailable(f"fetching the lock's {shown} failed ({reason})") from None


class _SameRealmRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects followed as urllib does, the credentials kept only where the new URL is in the
    realm they are for: an index that sends its downloads to object storage (a signed URL on
    another host) must not hand that host the index's password, and the storage refuses a
    request that carries two authorizations."""

    def __init__(self, url: str, found: Optional[tuple[str, str]]) -> None:
        self.realm = credentials.realm(url)
        self.found = found

    def redirect_request(  # noqa: PLR0917 - urllib's signature
            self, req: urllib.request.Request, fp: Any, code: int, msg: str,
            headers: Any, newurl: str) -> Optional[urllib.request.Request]:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.found and credentials.realm(newurl) == self.realm:
            for key, value in credentials.header(self.found).items():
                new.add_unredirected_header(key, value)
        return new


def _credentials_fix(wheel: LockedWheel) -> str:
    host = credentials.realm(wheel.location)[1]
    if wheel.index_name:
        prefix = credentials.env_name(wheel.index_name)
        ways = f"{prefix}_USERNAME and {prefix}_PASSWORD (as uv takes them), or as "
    else:
        ways = ""
    return (f"Give them on this machine as {ways}a `machine {host}` entry in ~/.netrc: only "
            "this machine fetches wheels, and the credentials are written nowhere.")
