"""The GPU and interconnect catalogue: ``profiles/gpus.json`` and ``profiles/interconnects.json``
loaded into frozen pydantic models. Parsing ``--gpus`` lives in ``advisor.hardware.cluster``. No torch.
"""

from __future__ import annotations

import functools
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from profiles import PROFILES_DIR


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuProfile(_Frozen):
    name: str = Field(description="Canonical name, e.g. A100-80GB-SXM.")
    vendor: Literal["nvidia", "amd"] = Field(description="Who makes it.")
    aliases: tuple[str, ...] = Field(default=(), description="Extra spellings users type.")
    nominal_memory_gb: float = Field(gt=0, description="The memory the product name gives (80 for an 80GB board); "
                                     "not what a plan fits against.")
    memory_bytes: int = Field(gt=0, description="Device memory in bytes a plan fits against: what torch reports as "
                                   "the device's total where a printout was found (memory_note).")
    memory_note: str | None = Field(default=None, description="Where memory_bytes comes from.")
    bf16_tflops: float | None = Field(default=None, description="Dense bf16 tensor peak.")
    fp16_tflops: float | None = Field(default=None, description="Dense fp16 tensor peak.")
    fp32_tflops: float = Field(gt=0, description="Non-tensor FP32 peak.")
    tf32_tflops: float | None = Field(default=None, description="Dense TF32 tensor peak.")
    fp8_tflops: float | None = Field(default=None, description="Dense FP8 tensor peak, FP32 accumulate; None: no fp8 "
                                      "tensor cores (--float8 refused).")
    fp8_source: str | None = Field(default=None, description="Datasheet the fp8 figure comes from.")
    hbm_bandwidth_gbps: float = Field(gt=0, description="Memory bandwidth, GB/s.")
    intra_node_link: str = Field(description="Default GPU-to-GPU link (an interconnect name).")
    default_gpus_per_node: int = Field(gt=0, description="Typical server size.")
    source: str = Field(description="Datasheet the figures come from.")
    note: str | None = Field(default=None, description="Which figures are assumptions.")


class Interconnect(_Frozen):
    name: str = Field(description="Identifier, e.g. nvlink4, ib-ndr.")
    kind: Literal["intra_node", "inter_node"] = Field(description="Inside a node or between nodes.")
    description: str = Field(description="Human-readable description.")
    bandwidth_gbps: float = Field(gt=0, description="Per GPU (or NIC), one direction, GB/s.")
    latency_us: float = Field(ge=0, description="Small-message latency, microseconds.")
    source: str = Field(description="Where the figures come from.")
    note: str | None = Field(default=None, description="Which figures are assumptions.")


class GpuDefaults(_Frozen):
    ambiguous: dict[str, str] = Field(
        description="Normalised short name -> canonical GPU it resolves to (e.g. a100 -> A100-80GB-SXM)."
    )
    inter_node_link: dict[str, str] = Field(
        description="GPU name -> default inter-node link when --nodes > 1 and none is given."
    )
    fallback_inter_node_link: str = Field(description="Inter-node link for GPUs not listed above.")


class Catalog(_Frozen):
    gpus: tuple[GpuProfile, ...]
    interconnects: tuple[Interconnect, ...]
    defaults: GpuDefaults

    @model_validator(mode="after")
    def _check_references(self) -> "Catalog":
        links = {i.name for i in self.interconnects}
        names = {g.name for g in self.gpus}
        bad = [g.name for g in self.gpus if g.intra_node_link not in links]
        bad += [f"default {k}->{v}" for k, v in self.defaults.ambiguous.items() if v not in names]
        bad += [v for v in self.defaults.inter_node_link.values() if v not in links]
        if self.defaults.fallback_inter_node_link not in links:
            bad.append(self.defaults.fallback_inter_node_link)
        if bad:
            raise ValueError(f"profiles reference unknown GPUs or links: {', '.join(bad)}")
        return self

    def gpu(self, name: str) -> GpuProfile:
        return next(g for g in self.gpus if g.name == name)

    def interconnect(self, name: str) -> Interconnect:
        for link in self.interconnects:
            if link.name == name:
                return link
        known = ", ".join(i.name for i in self.interconnects)
        raise ValueError(f"unknown interconnect {name!r}; known: {known}")


@functools.cache
def load_catalog() -> Catalog:
    """The GPU and interconnect catalogue (read once; the files are immutable package data)."""
    gpus = json.loads((PROFILES_DIR / "gpus.json").read_text())
    links = json.loads((PROFILES_DIR / "interconnects.json").read_text())
    return Catalog(gpus=gpus["gpus"], interconnects=links["interconnects"], defaults=gpus["defaults"])


