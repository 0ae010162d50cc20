"""Block kinds: one row per kind of model the estimators tell apart, and how a spec is recognised.

What belongs here: the registry ``KINDS`` (a kind's name, the block formula its activations run, its
facts objects on ``ModelSpec``, how it is detected on a spec, the module that counts it, the module of
its activation formulas, and what LoRA needs beyond a Llama-like block: a vision tower's linear layers)
and ``kind_of``, which every dispatch site reads instead of testing ``spec.ssm``, ``spec.encdec``,
``spec.vision``, ``spec.hybrid`` or ``spec.moe`` itself. The activation side of each row (its note, its
per-kind formulas) is ``advisor.estimate.activation_kinds``, keyed by the same names; a new family is
a facts module, its row here and its row there (``tests/model/test_block_kinds.py`` checks both tables).

Rows are tried in order and the first whose ``detect`` holds is the spec's kind; the detections are
written to exclude one another (the test checks it on every bundled model), so the order only states
the precedence the activation model always had: a Mamba mixer first, then an encoder-decoder, a language
model of a family with no formula, the vision-language models, Jamba, MoE, the families with their own
block formula, the Llama-like decoder; and for a spec with no shape, a bare size, a model without token
embeddings, or a guessed Llama-like shape. Pure: no torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel

from advisor.frozen import validated_copy
from advisor.model.bundled import load_architectures
from advisor.model.hybrid import HybridFacts
from advisor.model.kinds import EncDecFacts, SsmFacts, VisionFacts
from advisor.model.llava import ClipTowerFacts
from advisor.model.moe import MlaFacts, MoeFacts
from advisor.model.spec import ModelSpec

Linears = dict[str, list[tuple[int, int]]]

# model_types with an activation formula of their own (advisor.estimate.activations_blocks)
_OWN_FORMULA = {"gpt2": "gpt2", "bert": "bert", "gpt_neox": "gpt_neox", "mamba": "mamba"}
# Counting formulas (profiles/architectures.json) whose language model is a Llama-like decoder: Qwen-MoE and
# DeepSeek with an MoE MLP (advisor.estimate.activations_moe), Qwen2.5-VL's and Llava's language models
# (their towers: advisor.estimate.activations_vision), Jamba's attention layers (activations_hybrid).
_DECODER_FORMULAS = ("decoder", "qwen_moe", "deepseek", "qwen_vl", "llava", "jamba")
_QWEN_VL = ("qwen2_5_vl", "qwen2_vl")


def activation_family(model_type: str | None) -> str | None:
    """The formula written for ``model_type``: its own, or the decoder one for the Llama-like
    families whose module tree ``profiles/architectures.json`` maps to the decoder count; else None."""
    if model_type in _OWN_FORMULA:
        return _OWN_FORMULA[model_type]
    info = load_architectures().get(model_type or "")
    return "decoder" if info is not None and info.formula in _DECODER_FORMULAS else None


def clip_tower_linears(spec: ModelSpec) -> Linears:
    """The linear layers of one CLIP encoder layer of a Llava tower (modeling_clip.py: CLIPAttention's
    q/k/v/out_proj, CLIPMLP's fc1/fc2)."""
    tower = spec.vision
    if tower is None:
        return {}
    w, inter = tower.width, tower.intermediate_size
    return {"q_proj": [(w, w)], "k_proj": [(w, w)], "v_proj": [(w, w)], "out_proj": [(w, w)],
            "fc1": [(w, inter)], "fc2": [(inter, w)]}


def llava_projector_linears(spec: ModelSpec) -> Linears:
    """The projector's linear_1 and linear_2 (modeling_llava.py LlavaMultiModalProjector), which all-linear adapts."""
    text = spec.hidden_size
    return {"linear_1": [(spec.vision.projector_in, text)], "linear_2": [(text, text)]}


@dataclass(frozen=True)
class BlockKind:
    """One kind of model: a row of ``KINDS``."""

    name: str
    family: str  # the block formula its activations run (ActivationShape.family)
    detect: Callable[[ModelSpec], bool]
    model_module: str  # where its parameters are counted and its facts built
    activation_module: str  # where its activation formulas live
    facts: dict[str, tuple[type[BaseModel], ...]] = field(default_factory=dict)  # ModelSpec field -> facts types
    tower_linears: Callable[[ModelSpec], Linears] | None = None  # LoRA: one tower layer's linears PEFT can match
    tower_layers: Callable[[ModelSpec], int] | None = None  # how many such layers
    projector_linears: Callable[[ModelSpec], Linears] | None = None  # all-linear's extra linears beside the tower
    pipelines: bool = True  # its stack's pipeline stages and expert-parallel groups are modelled (not Jamba's)
    # tensor parallelism over a stack of unequal blocks: (spec, split: a block's parameters -> one TP rank's,
    # one rank's largest block) -> (the facts fields as one rank holds them, its dense_layer_saving); None: alike
    split_blocks: Callable[[ModelSpec, Callable[[int], int], int], tuple[dict, int]] | None = None
    # LoRA over a stack of unequal blocks: (spec, each block's adapters, all adapters) -> the spec's fields with
    # them added to each block's own count; None: alike blocks (layer_params grows by one block's adapters)
    grow_blocks: Callable[[ModelSpec, list[int], int], dict] | None = None


def _split_dense_layers(spec: ModelSpec, split: Callable[[int], int], layer_tp: int) -> tuple[dict, int]:
    """DeepSeek's dense layers: smaller blocks, split too."""
    if spec.moe is None or not spec.moe.num_dense_layers:
        return {}, 0
    dense_tp = split(spec.moe.dense_layer_params)
    return {"moe": validated_copy(spec.moe, dict(dense_layer_params=dense_tp))}, spec.moe.num_dense_layers * (
        layer_tp - dense_tp)


def _split_hybrid_blocks(spec: ModelSpec, split: Callable[[int], int], layer_tp: int) -> tuple[dict, int]:
    """Jamba: every block of the stack, each split (the spec's saving reads these)."""
    update, _ = _split_dense_layers(spec, split, layer_tp)
    blocks = tuple(split(b) for b in spec.hybrid.block_params)
    return {**update, "hybrid": validated_copy(spec.hybrid, dict(block_params=blocks))}, len(blocks) * layer_tp - sum(
        blocks)


def _grow_dense_layers(spec: ModelSpec, per_block: list[int], added: int) -> dict:
    """DeepSeek's first_k_dense_replace: the first ``num_dense_layers`` dense blocks' adapters to
    ``dense_layer_params``, the rest's to ``layer_params``, the remainder (the head) to ``other_params``; blocks
    of one kind with unequal adapters: all of them in ``other_params``."""
    dense = spec.moe.num_dense_layers if spec.moe is not None else 0
    if not dense:
        return {}
    dense_extra = per_block[0]
    sparse_extra = per_block[dense] if dense < spec.num_layers else 0
    counted = dense * dense_extra + (spec.num_layers - dense) * sparse_extra
    if counted > added:
        return dict(other_params=spec.other_params + added)
    return dict(layer_params=spec.layer_params + sparse_extra, other_params=spec.other_params + added - counted,
                moe=validated_copy(spec.moe, {"dense_layer_params": spec.moe.dense_layer_params + dense_extra}))


def _grow_hybrid_blocks(spec: ModelSpec, per_block: list[int], added: int) -> dict:
    """Jamba: each block's adapters to its own ``HybridFacts.block_params`` (``layer_params`` the largest)."""
    blocks = tuple(params + extra for params, extra in zip(spec.hybrid.block_params, per_block))
    return dict(layer_params=max(blocks), other_params=spec.other_params + added - sum(per_block),
                hybrid=validated_copy(spec.hybrid, {"block_params": blocks}))


def _mamba(spec: ModelSpec) -> bool:
    return spec.ssm is not None and None not in (spec.num_layers, spec.hidden_size, spec.intermediate_size,
                                                 spec.vocab_size)


def _shaped(spec: ModelSpec) -> bool:
    """A spec whose own shape the activation model reads (not a Mamba mixer, which has no attention)."""
    return spec.has_architecture and not _mamba(spec)


def _encdec(spec: ModelSpec) -> bool:
    return _shaped(spec) and spec.encdec is not None


def _unknown(spec: ModelSpec) -> bool:
    """A language model of a family with no formula (a Llama-like decoder of its shape assumed, or traced)."""
    return (_shaped(spec) and spec.encdec is None and spec.model_type is not None
            and activation_family(spec.model_type) is None)


def _language_model(spec: ModelSpec, model_types: tuple[str, ...] | None = None) -> bool:
    """A shaped decoder-only spec whose family has a formula (or a live module, with no model_type); with
    ``model_types``: one of them, else none of the vision-language ones."""
    if not _shaped(spec) or spec.encdec is not None or _unknown(spec):
        return False
    return spec.model_type in model_types if model_types else spec.model_type not in (*_QWEN_VL, "llava")


def _jamba(spec: ModelSpec) -> bool:
    return _language_model(spec) and spec.hybrid is not None


def _moe(spec: ModelSpec) -> bool:
    return _language_model(spec) and spec.hybrid is None and bool(spec.num_experts)


def _plain(spec: ModelSpec, family: str) -> bool:
    """A language model of ``family``'s own block formula and none of the kinds above (a live module with
    no model_type runs the decoder's)."""
    if not _language_model(spec) or spec.hybrid is not None or spec.num_experts:
        return False
    return (activation_family(spec.model_type) or "decoder") == family


def _size(spec: ModelSpec) -> bool:
    return not spec.has_architecture and not _mamba(spec) and spec.source == "params"


def _no_embeddings(spec: ModelSpec) -> bool:
    return not spec.has_architecture and not _mamba(spec) and spec.source != "params" and spec.vocab_size is None


def _guessed(spec: ModelSpec) -> bool:
    return not spec.has_architecture and not _mamba(spec) and spec.source != "params" and spec.vocab_size is not None


_BLOCKS = "advisor.estimate.activations_blocks"
KINDS: tuple[BlockKind, ...] = (
    BlockKind("mamba", "mamba", _mamba, "advisor.model.kinds", "advisor.estimate.activations_ssm",
              facts={"ssm": (SsmFacts,)}),
    BlockKind("encdec", "encdec", _encdec, "advisor.model.kinds", "advisor.estimate.activations_encdec",
              facts={"encdec": (EncDecFacts,)}),
    # a language model of a family with no formula: a Llama-like decoder of its own shape, or traced
    BlockKind("unknown", "decoder", _unknown, "advisor.model.meta", "advisor.estimate.traced"),
    BlockKind("qwen_vl", "decoder", lambda spec: _language_model(spec, _QWEN_VL), "advisor.model.kinds",
              "advisor.estimate.activations_vision", facts={"vision": (VisionFacts,)}),
    BlockKind("llava", "decoder", lambda spec: _language_model(spec, ("llava",)), "advisor.model.llava",
              "advisor.estimate.activations_llava", facts={"vision": (ClipTowerFacts,)},
              tower_linears=clip_tower_linears, tower_layers=lambda spec: spec.vision.num_layers,
              projector_linears=llava_projector_linears),
    BlockKind("jamba", "decoder", _jamba, "advisor.model.hybrid", "advisor.estimate.activations_hybrid",
              facts={"hybrid": (HybridFacts,), "moe": (MoeFacts,)}, pipelines=False, split_blocks=_split_hybrid_blocks,
              grow_blocks=_grow_hybrid_blocks),
    BlockKind("moe", "decoder", _moe, "advisor.model.moe", "advisor.estimate.activations_moe",
              facts={"moe": (MoeFacts,), "mla": (MlaFacts,)}, split_blocks=_split_dense_layers,
              grow_blocks=_grow_dense_layers),
    BlockKind("gpt2", "gpt2", lambda spec: _plain(spec, "gpt2"), "advisor.model.architectures", _BLOCKS),
    BlockKind("bert", "bert", lambda spec: _plain(spec, "bert"), "advisor.model.architectures", _BLOCKS),
    BlockKind("gpt_neox", "gpt_neox", lambda spec: _plain(spec, "gpt_neox"), "advisor.model.meta", _BLOCKS),
    BlockKind("decoder", "decoder", lambda spec: _plain(spec, "decoder"), "advisor.model.architectures", _BLOCKS),
    # no shape of its own: a bare size (a Llama-like shape assumed), no token embeddings (not modelled),
    # or some shape fields missing (a Llama-like decoder, the rest guessed)
    BlockKind("size", "decoder", _size, "advisor.model.spec", "advisor.estimate.activations"),
    BlockKind("none", "none", _no_embeddings, "advisor.model.meta", "advisor.estimate.activations"),
    BlockKind("guessed", "decoder", _guessed, "advisor.model.meta", "advisor.estimate.activations"),
)
KIND_NAMES = tuple(kind.name for kind in KINDS)


@functools.lru_cache(maxsize=256)  # a plan asks about a few specs a thousand times (specs are frozen: hashable)
def kind_of(spec: ModelSpec) -> BlockKind:
    """The spec's kind: the first row of ``KINDS`` that detects it (the rows exclude one another)."""
    found = next((kind for kind in KINDS if kind.detect(spec)), None)
    assert found is not None, f"no block kind detects {spec.name} ({spec.model_type})"
    return found


def kinds_detecting(spec: ModelSpec) -> tuple[str, ...]:
    """Every kind whose detection holds for ``spec`` (one, for a well-formed registry)."""
    return tuple(kind.name for kind in KINDS if kind.detect(spec))
