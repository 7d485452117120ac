"""Where clusterrun keeps its state on this machine: $CLUSTERRUN_HOME, default ~/.clusterrun."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = "~/.clusterrun"


def home_setting() -> str:
    """$CLUSTERRUN_HOME made absolute, else ``~/.clusterrun`` as written (``~`` unexpanded)."""
    value = os.environ.get("CLUSTERRUN_HOME")
    return os.path.abspath(os.path.expanduser(value)) if value else DEFAULT_HOME


def home() -> Path:
    """Local state: $CLUSTERRUN_HOME, default ~/.clusterrun."""
    return Path(os.path.expanduser(home_setting()))
