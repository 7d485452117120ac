"""One host's facts as the probe reports them (clusterrun/remote/probe.py), read once into
frozen values for the checks: ``HostFacts.from_json(reply)``. The wire format is the probe's;
the raw reply stays in ``HostReport.facts`` for what is passed on as it came (plan, launch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from clusterrun.preflight.gpu_facts import NvidiaFacts
from clusterrun.preflight.jsonfields import integer


@dataclass(frozen=True)
class HostFacts:
    """``gpus``: how many GPUs nvidia-smi sees (0 also when unknown); ``nvidia``: its details,
    None when the probe sent none."""

    gpus: int = 0
    nvidia: Optional[NvidiaFacts] = None

    @classmethod
    def from_json(cls, reply: Mapping[str, object]) -> HostFacts:
        return cls(gpus=integer(reply.get("gpus")) or 0,
                   nvidia=NvidiaFacts.from_json(reply.get("nvidia")))
