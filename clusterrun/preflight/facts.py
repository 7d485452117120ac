"""One host's facts as the probe reports them (clusterrun/remote/probe.py), read once into
frozen values for the checks: ``HostFacts.from_json(reply)``. The wire format is the probe's;
the raw reply stays in ``HostReport.facts`` for what is passed on as it came (plan, launch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from clusterrun.preflight import limit_facts
from clusterrun.preflight.gpu_facts import NvidiaFacts
from clusterrun.preflight.jsonfields import integer, obj
from clusterrun.preflight.limit_facts import IbPort, Limits


@dataclass(frozen=True)
class HostFacts:
    """``gpus``: how many GPUs nvidia-smi sees (0 also when unknown); ``nvidia``: its details,
    None when the probe sent none; ``infiniband``: device -> port -> state ({}: no RDMA stack,
    None: not reported); ``env``: the host's own environment, as far as the probe sends it."""

    gpus: int = 0
    nvidia: Optional[NvidiaFacts] = None
    limits: Limits = field(default_factory=Limits)
    infiniband: Optional[Mapping[str, Mapping[str, IbPort]]] = None
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, reply: Mapping[str, object]) -> HostFacts:
        return cls(gpus=integer(reply.get("gpus")) or 0,
                   nvidia=NvidiaFacts.from_json(reply.get("nvidia")),
                   limits=Limits.from_json(reply.get("limits")),
                   infiniband=limit_facts.infiniband(reply),
                   env={str(k): str(v) for k, v in obj(reply.get("env")).items()})
