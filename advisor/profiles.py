"""Load and validate the bundled facts under ``profiles/``: GPUs, interconnects, architecture
tables and bundled model configs.

What belongs here: reading JSON files shipped as package data and turning them into frozen
pydantic models. What does not: parsing user input (``advisor.hardware``), counting parameters
(``advisor.architectures``). No torch import.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

import profiles as _profiles_pkg

PROFILES_DIR = Path(_profiles_pkg.__file__).parent
MODELS_DIR = PROFILES_DIR / "models"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuProfile(_Frozen):
    name: str = Field(description="Canonical name, e.g. A100-80GB-SXM.")
    vendor: Literal["nvidia", "amd"] = Field(description="Who makes it.")
    aliases: tuple[str, ...] = Field(default=(), description="Extra spellings users type.")
    memory_gib: float = Field(gt=0, description="Marketed memory size.")
    memory_bytes: int = Field(gt=0, description="Device memory in bytes used for 'fits'.")
    memory_note: str | None = Field(default=None, description="Where memory_bytes comes from.")
    bf16_tflops: float | None = Field(default=None, description="Dense bf16 tensor peak.")
    fp16_tflops: float | None = Field(default=None, description="Dense fp16 tensor peak.")
    fp32_tflops: float = Field(gt=0, description="Non-tensor FP32 peak.")
    tf32_tflops: float | None = Field(default=None, description="Dense TF32 tensor peak.")
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


class ArchitectureInfo(_Frozen):
    formula: Literal["decoder", "gpt2", "bert"] = Field(description="Counting formula to use.")
    block_class: str = Field(description="Transformer block class (FSDP wrap unit).")
    tie_word_embeddings: bool = Field(description="Config-class default for tied embeddings.")
    norms_per_layer: int = Field(default=2, description="Norm weight vectors per block.")
    qkv_bias: bool = Field(default=False, description="q/k/v projections carry a bias.")
    o_bias: bool = Field(default=False, description="Output projection carries a bias.")
    bias_key: str | None = Field(default=None, description="Config key overriding both biases.")
    mlp_bias_key: str | None = Field(default=None, description="Config key for MLP biases.")
    qk_norm: bool = Field(default=False, description="Per-head RMSNorm on q and k.")
    moe: bool = Field(default=False, description="Sparse mixture-of-experts MLP.")


@functools.cache
def load_catalog() -> Catalog:
    """The GPU and interconnect catalogue (read once; the files are immutable package data)."""
    gpus = json.loads((PROFILES_DIR / "gpus.json").read_text())
    links = json.loads((PROFILES_DIR / "interconnects.json").read_text())
    return Catalog(gpus=gpus["gpus"], interconnects=links["interconnects"], defaults=gpus["defaults"])


@functools.cache
def load_architectures() -> dict[str, ArchitectureInfo]:
    raw = json.loads((PROFILES_DIR / "architectures.json").read_text())["architectures"]
    return {k: ArchitectureInfo(**v) for k, v in raw.items()}


@functools.cache
def bundled_model_ids() -> tuple[str, ...]:
    """Hub ids of the bundled configs (``profiles/models/<org>/<name>.json``)."""
    return tuple(sorted(f"{p.parent.name}/{p.stem}" for p in MODELS_DIR.glob("*/*.json")))


def find_bundled_model(name: str) -> str | None:
    """The bundled hub id matching ``name`` case-insensitively, by full id or by bare name."""
    wanted = name.strip().lower()
    for model_id in bundled_model_ids():
        if wanted in (model_id.lower(), model_id.split("/")[1].lower()):
            return model_id
    return None


def load_bundled_config(model_id: str) -> dict:
    org, name = model_id.split("/")
    return json.loads((MODELS_DIR / org / f"{name}.json").read_text())
