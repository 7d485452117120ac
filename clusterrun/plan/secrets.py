"""Which environment variables are secrets, and how they are masked wherever clusterrun shows or
stores an environment."""

from __future__ import annotations

import re

SECRET_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
MASK = "******"
def is_secret(name: str) -> bool:
    return bool(SECRET_RE.search(name))


def masked(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}
