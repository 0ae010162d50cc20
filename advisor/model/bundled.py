"""Bundled model facts: ``profiles/architectures.json`` (which formula counts each ``model_type``)
and the bundled ``config.json`` copies under ``profiles/models/``. Counting lives in
``advisor.model.architectures``. No torch.
"""

from __future__ import annotations

import functools
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from profiles import MODELS_DIR, PROFILES_DIR


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ArchitectureInfo(_Frozen):
    formula: Literal["decoder", "gpt2", "bert", "qwen_moe", "deepseek", "t5", "bart", "mamba", "jamba", "qwen_vl", "llava"] = Field(description="Counting formula to use.")
    block_classes: tuple[str, ...] = Field(min_length=1, description="Repeated layer classes, one FSDP unit each "
                                           "(several where the model stacks several kinds: Jamba, BART).")
    tie_word_embeddings: bool = Field(description="Config-class default for tied embeddings.")
    norms_per_layer: int = Field(default=2, description="Norm weight vectors per block.")
    qkv_bias: bool = Field(default=False, description="q/k/v projections carry a bias.")
    o_bias: bool = Field(default=False, description="Output projection carries a bias.")
    bias_key: str | None = Field(default=None, description="Config key overriding both biases.")
    mlp_bias_key: str | None = Field(default=None, description="Config key for MLP biases.")
    qk_norm: bool = Field(default=False, description="Per-head RMSNorm on q and k.")
    moe: bool = Field(default=False, description="Sparse mixture-of-experts MLP.")
    shared_expert_key: str | None = Field(default=None, description="Config key of a gated shared expert's width (Qwen2-MoE).")
    fused_projections: bool = Field(default=False, description="One qkv_proj and one gate_up_proj per block.")
    softcapping: bool = Field(default=False, description="The config class soft-caps attention scores and "
                              "logits unless the config sets attn_logit_softcapping / final_logit_softcapping "
                              "to null (transformers' Gemma2Config: 50.0 and 30.0).")
    window_every_layer: bool = Field(default=False, description="The config's sliding_window applies to every "
                                     "layer (transformers' Mistral, Mixtral, Phi-3 attention).")
    eager_masks: int = Field(default=1, ge=1, description="Additive b x s x s masks the model builds for eager "
                             "attention (transformers' Gemma 2: a full and a sliding-window one, both always).")
    fp32_norm_scale: bool = Field(default=False, description="RMSNorm scales by (1 + weight) in fp32 (Gemma): its "
                                  "normalised tensor is saved in fp32.")
    lora_targets: tuple[str, ...] | None = Field(default=None, description="PEFT's default LoRA targets.")
    config_defaults: dict[str, dict[str, int | str]] | None = Field(
        default=None, description="Class defaults of sub-configs a config.json may omit (Llava: text_config, vision_config).")


@functools.cache
def load_architectures() -> dict[str, ArchitectureInfo]:
    raw = json.loads((PROFILES_DIR / "architectures.json").read_text())["architectures"]
    return {k: ArchitectureInfo(**v) for k, v in raw.items()}


@functools.cache
def load_peft_lora_targets() -> dict[str, tuple[str, ...]]:
    """PEFT's default LoRA targets per ``model_type`` (``profiles/peft_lora_targets.json``)."""
    raw = json.loads((PROFILES_DIR / "peft_lora_targets.json").read_text())["targets"]
    return {k: tuple(v) for k, v in raw.items()}


@functools.cache
def load_peft_expert_targets() -> dict[str, frozenset[str]]:
    """Target names PEFT maps onto a mixture-of-experts model's stacked expert weights and router, per
    ``model_type`` (``profiles/peft_lora_targets.json``, ``moe_expert_targets``)."""
    raw = json.loads((PROFILES_DIR / "peft_lora_targets.json").read_text())["moe_expert_targets"]
    return {k: frozenset(v) for k, v in raw.items()}


@functools.cache
def load_peft_incompatible_targets() -> dict[str, frozenset[str]]:
    """Module names PEFT refuses to put a LoRA adapter on, per ``model_type`` (``profiles/peft_lora_targets.json``,
    ``incompatible_targets``)."""
    raw = json.loads((PROFILES_DIR / "peft_lora_targets.json").read_text())["incompatible_targets"]
    return {k: frozenset(v) for k, v in raw.items()}


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


class TensorParallelFacts(_Frozen):
    """What the TP plans split (``profiles/tensor_parallel.json``, where each field's source is cited)."""

    no_tp_plan: frozenset[str] = Field(description="Causal-LM model_types with no transformers TP plan: "
                                       "embedding and head whole on every TP rank (wrappers' derived plan).")
    row_parallel: frozenset[str] = Field(description="Block linears the plans split row-wise (partial-sum outputs).")
    selective_row_parallel_kept: dict[str, int] = Field(description="Traced families: row-parallel products per "
                                                        "block whose outputs selective checkpointing keeps.")
    attention_output_copied: frozenset[str] = Field(default=frozenset(), description="Traced families whose "
                                                    "o_proj saves a copy of SDPA's output (partial rotary's cat).")
    mlp_wide_saved: dict[str, int] = Field(default_factory=dict, description="Traced families whose MLP is not "
                                           "gated: tensors of its inner width a block saves (the count lists four).")
    unsupported_tp_styles: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="Causal-LM model_types whose transformers TP plan names styles "
        "wrappers.tensor_parallel cannot apply, with those styles: no tensor-parallel mesh for them.")


@functools.cache
def load_tensor_parallel() -> TensorParallelFacts:
    raw = json.loads((PROFILES_DIR / "tensor_parallel.json").read_text())
    return TensorParallelFacts(**{k: v for k, v in raw.items() if not k.startswith("_")})
