"""``facts["nvidia"]`` as the probe sends it (clusterrun/remote/probe/nvidia.py; its shape is in
preflight/gpus.py), read once into frozen values for the GPU checks. A missing or odd field
reads as unknown (None), as nvidia-smi's own "[N/A]" does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from clusterrun.jsonfields import flag, integer, items, obj, text


@dataclass(frozen=True)
class NvidiaGpu:
    """One GPU nvidia-smi lists; memory in MiB."""

    index: int
    name: Optional[str] = None
    driver: Optional[str] = None
    memory_used: Optional[int] = None
    memory_total: Optional[int] = None
    compute_mode: Optional[str] = None
    ecc_uncorrected: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remap_pending: Optional[bool] = None
    remap_failure: Optional[bool] = None

    @classmethod
    def from_json(cls, found: Mapping[str, object]) -> Optional[NvidiaGpu]:
        """None for a GPU without an index (the probe drops those itself)."""
        index = integer(found.get("index"))
        if index is None:
            return None
        return cls(index, text(found.get("name")), text(found.get("driver")),
                   integer(found.get("memory_used")), integer(found.get("memory_total")),
                   text(found.get("compute_mode")), integer(found.get("ecc_uncorrected")),
                   flag(found.get("retired_pages_pending")), flag(found.get("remap_pending")),
                   flag(found.get("remap_failure")))


@dataclass(frozen=True)
class GpuApp:
    """A compute process on a GPU. ``visible``: its pid is in the probe's PID namespace;
    ``mine``: it runs as the probe's own user (None: unknown)."""

    gpu: Optional[int] = None
    pid: Optional[int] = None
    used_memory: Optional[int] = None
    process_name: Optional[str] = None
    user: Optional[str] = None
    visible: bool = False
    mine: Optional[bool] = None

    @classmethod
    def from_json(cls, found: Mapping[str, object]) -> GpuApp:
        return cls(integer(found.get("gpu")), integer(found.get("pid")),
                   integer(found.get("used_memory")), text(found.get("process_name")),
                   text(found.get("user")), flag(found.get("visible")) is True,
                   flag(found.get("mine")))


@dataclass(frozen=True)
class NvidiaFacts:
    """``smi``: nvidia-smi's path (None: not on the PATH); ``errors``: per query that failed,
    why (``"gpus"`` among them: nvidia-smi itself fails)."""

    smi: Optional[str] = None
    driver: Optional[str] = None
    gpus: tuple[NvidiaGpu, ...] = ()
    apps: tuple[GpuApp, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: object) -> Optional[NvidiaFacts]:
        """None when the probe sent no nvidia-smi details at all."""
        if not isinstance(value, dict):
            return None
        gpus = (NvidiaGpu.from_json(obj(g)) for g in items(value.get("gpus")))
        return cls(text(value.get("smi")), text(value.get("driver")),
                   tuple(g for g in gpus if g is not None),
                   tuple(GpuApp.from_json(obj(a)) for a in items(value.get("apps"))),
                   {str(k): str(v) for k, v in obj(value.get("errors")).items()})
