"""The credentials a lock's wheel URL is fetched with, found where uv and pip users already keep
them: uv's ``UV_INDEX_<NAME>_USERNAME``/``_PASSWORD`` for an index named in the project's
``[[tool.uv.index]]``, the user name and password in that index's URL in pyproject.toml, and
``~/.netrc`` (``$NETRC``). They are sent only to the realm (scheme, host, port) they are for,
only from this machine, and are never written anywhere: the hosts get the wheels, not a URL.
"""

from __future__ import annotations

import base64
import netrc
import os
import re
from typing import Optional
from urllib.parse import unquote, urlsplit


def env_name(index: str) -> str:
    """uv's variable prefix for an index name: upper case, other than letters and digits `_`."""
    return "UV_INDEX_" + re.sub(r"[^A-Za-z0-9]", "_", index).upper()


def realm(url: str) -> tuple[str, str, Optional[int]]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def strip(url: str) -> str:
    """``url`` without a user name or password, as messages show it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


def _from_netrc(host: str) -> Optional[tuple[str, str]]:
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    if not os.path.isfile(path):
        return None
    try:
        found = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if not found:
        return None
    login, _account, password = found
    return login or "", password or ""


def lookup(url: str, index_url: Optional[str],
           index_name: Optional[str]) -> Optional[tuple[str, str]]:
    """(user, password) for fetching ``url``, or None. The index's own credentials count only
    where ``url`` is in the index's realm: a wheel an index links to on another host gets that
    host's netrc entry, as uv does."""
    if index_url and realm(index_url) == realm(url):
        if index_name:
            prefix = env_name(index_name)
            user = os.environ.get(prefix + "_USERNAME")
            password = os.environ.get(prefix + "_PASSWORD")
            if user is not None or password is not None:
                return user or "", password or ""
        parts = urlsplit(index_url)
        if parts.username is not None:
            return unquote(parts.username), unquote(parts.password or "")
    parts = urlsplit(url)
    if parts.username is not None:
        return unquote(parts.username), unquote(parts.password or "")
    return _from_netrc((parts.hostname or "").lower())


def header(found: Optional[tuple[str, str]]) -> dict[str, str]:
    if found is None:
        return {}
    token = base64.b64encode(f"{found[0]}:{found[1]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}
