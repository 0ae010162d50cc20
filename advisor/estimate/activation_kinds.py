"""The activation side of each block kind: one row per kind of ``advisor.model.block_kinds.KINDS``.

What belongs here: for each kind, the shape fields the activation model reads from its spec (``shape``),
the note the plan shows (``note``), and the per-kind pieces ``advisor.estimate.activations.
estimate_activations`` composes a micro-batch from: the block formula a token, how the blocks add up
(Jamba's layers each as its kind is, an MoE stack's dense layers and router weight copy), an MoE
block's backward, what selective checkpointing keeps in an MoE block, the whole estimate of a kind
composed apart (the encoder-decoder's two stacks, a model with no activation model), and what a vision
tower saves beside the language model (``advisor.estimate.memory``). The formulas themselves live in
the kind's own module (``BlockKind.activation_module``: ``activations_blocks``, ``activations_moe``,
``activations_ssm``, ``activations_hybrid``, ``activations_encdec``, ``activations_vision``,
``activations_llava``); this module only wires them to the kind. No if/elif on a spec's facts
fields elsewhere: a site reads ``activation_kind(spec)`` or ``row_of(shape)``.

Pure: integers in, integer bytes out; the estimate's types (``advisor.estimate.activations``) are
annotations here, so that module can import this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from advisor.estimate import activations_moe as moe_acts
from advisor.estimate.activations_blocks import (
    decoder_layer_per_token, encoder_eager_remaining_per_token, encoder_layer_per_token, frozen_encoder_layer_per_token,
    mamba_layer_per_token, neox_layer_per_token,
)
from advisor.estimate.activations_encdec import BART_NOTE, ENCDEC_NOTE, estimate_encdec_activations
from advisor.estimate.activations_hybrid import JAMBA_NOTE, hybrid_layers_per_token
from advisor.estimate.activations_llava import clip_weight_casts
from advisor.estimate.activations_ssm import SSM_NOTE
from advisor.estimate.activations_vision import vision_note, vision_saved_bytes
from advisor.model.block_kinds import KINDS, activation_family, kind_of
from advisor.model.bundled import load_architectures
from advisor.model.moe import MoeFacts
from advisor.model.spec import ModelSpec

if TYPE_CHECKING:
    from advisor.estimate.activations import ActivationShape, Adapters, Dtypes

SIZE_ONLY_NOTE = "only the size is known: activations assume a Llama-like shape; pass a config for exact figures"


# -- shape fields --------------------------------------------------------------------------------------------

def _info_qk_norm(model_type: str | None) -> bool:
    info = load_architectures().get(model_type or "")
    return info is not None and info.qk_norm


def _info_block_extras(model_type: str | None) -> dict:
    """Gemma 2's four norms a block and its two eager masks, Phi-3's fused projections
    (``profiles/architectures.json``)."""
    info = load_architectures().get(model_type or "")
    if info is None or info.formula != "decoder":
        return {}
    return dict(sandwich_norms=info.norms_per_layer == 4, eager_masks=info.eager_masks,
                fused_qkv=info.fused_projections, fp32_norm_scale=info.fp32_norm_scale)


def _size_shape(total_params: int) -> dict:
    """A Llama-like shape with P ~= 12 L h^2 and L ~= h / 128 (Llama 2 7B: h=4096, L=32)."""
    hidden = max(256, round((total_params * 128 / 12) ** (1 / 3) / 256) * 256)
    layers = max(1, round(total_params / (12 * hidden * hidden)))
    return dict(num_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 128,
                num_kv_heads=hidden // 128, head_dim=128, intermediate_size=hidden * 8 // 3, vocab_size=32000)


def _own_fields(spec: ModelSpec, guess: dict) -> tuple[dict, bool]:
    """The spec's shape fields, the missing ones filled from ``guess``; attention heads from the
    width when only the width is known (128 channels a head, at least one). Also: whether any was guessed."""
    own = {k: getattr(spec, k) for k in guess if getattr(spec, k) is not None}
    fields = {**guess, **own}
    h = fields["hidden_size"]
    if spec.num_attention_heads is None:
        heads = max(1, h // 128)
        fields.update(num_attention_heads=heads, num_kv_heads=heads, head_dim=max(1, h // heads))
    else:
        fields["num_kv_heads"] = spec.num_kv_heads or spec.num_attention_heads
        fields["head_dim"] = spec.head_dim or max(1, h // spec.num_attention_heads)
    if spec.intermediate_size is None:
        fields["intermediate_size"] = h * 8 // 3
    return fields, len(own) < len(guess)


def _what(spec: ModelSpec) -> str:
    return f"model_type {spec.model_type}" if spec.model_type else (spec.architecture or "this model")


def _known(spec: ModelSpec) -> str:
    parts = [f"vocabulary {spec.vocab_size:,}" if spec.vocab_size else None,
             f"width {spec.hidden_size:,}" if spec.hidden_size else None,
             f"{spec.num_layers} layers" if spec.num_layers else None]
    return ", ".join(p for p in parts if p)


def _mamba_fields(spec: ModelSpec) -> dict:
    return dict(num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=1, num_kv_heads=1,
                head_dim=1, intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size, family="mamba",
                ssm=spec.ssm)


def _spec_fields(spec: ModelSpec, family: str) -> dict:
    """The spec's own shape (a kind with a formula, or a language model of a family without one, as a
    Llama-like decoder): the decoder's refinements only where the model_type's own formula is the decoder's."""
    heads, own = spec.num_attention_heads, activation_family(spec.model_type)
    decoder = own == "decoder"
    return dict(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=heads,
        num_kv_heads=spec.num_kv_heads or heads, head_dim=spec.head_dim or spec.hidden_size // heads,
        intermediate_size=spec.intermediate_size or 4 * spec.hidden_size, vocab_size=spec.vocab_size,
        family=family, num_experts=spec.num_experts, num_experts_per_token=spec.num_experts_per_token,
        moe=spec.moe, mla=spec.mla, qk_norm=bool(decoder and _info_qk_norm(spec.model_type)),
        sliding_window=spec.sliding_window if decoder else None, attn_softcap=spec.attn_softcap and decoder,
        logit_softcap=spec.logit_softcap and decoder, one_op_mlp_act=spec.one_op_mlp_act and own == "gpt2",
        no_residual_dropout=spec.no_residual_dropout and own == "gpt2",
        no_embedding_dropout=spec.no_embedding_dropout and own == "gpt2",
        sequential_residual=spec.sequential_residual and own == "gpt_neox",
        encdec=spec.encdec if family == "encdec" else None, hybrid=spec.hybrid, head=spec.head,
        **(_info_block_extras(spec.model_type) if decoder else {}),
    )


def _size_fields(spec: ModelSpec) -> dict:
    return dict(**_size_shape(spec.total_params), family="decoder", assumed=True)


def _no_embedding_fields(spec: ModelSpec) -> dict:
    fields, guessed = _own_fields(spec, _size_shape(spec.total_params))
    return dict(**{**fields, "vocab_size": 0}, family="none", assumed=guessed)


def _guessed_fields(spec: ModelSpec) -> dict:
    fields, _ = _own_fields(spec, _size_shape(spec.total_params))
    return dict(**fields, family="decoder", assumed=True)


# -- per-kind pieces of the estimate --------------------------------------------------------------------------

def _not_modelled(shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int,
                  target_len: int | None, checkpointing: bool, eager: bool, adapters: Adapters | None = None
                  ) -> dict[str, int]:
    """No token embeddings: no activation model (the shape's note says so)."""
    return dict(saved_bytes=0, logits_bytes=0, loss_transient_bytes=0, layer_bytes=0, backward_temp_bytes=0,
                returned_logits_bytes=0)


def _encdec(shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int, target_len: int | None,
            checkpointing: bool, eager: bool, adapters: Adapters | None = None) -> dict[str, int]:
    """Both stacks (advisor.estimate.activations_encdec); target length default: seq_len. ``adapters``: LoRA on
    the frozen base (``advisor.model.lora.adapter_inputs`` names each adapter's stack and module)."""
    return estimate_encdec_activations(shape, dt, micro_batch_size=micro_batch_size, src_len=seq_len,
                                       tgt_len=target_len or seq_len, checkpointing=checkpointing, eager=eager,
                                       adapters=adapters)


def _jamba_layers(shape: ActivationShape, dt: Dtypes, tokens: int, layer: int, *, seq_len: int,
                  eager: bool) -> tuple[int, int]:
    """Jamba: each layer as its kind is (advisor.estimate.activations_hybrid)."""
    per_layer = hybrid_layers_per_token(shape, dt, seq_len=seq_len, eager=eager)
    return tokens * sum(per_layer), tokens * max(per_layer)


def _moe_layers(shape: ActivationShape, dt: Dtypes, tokens: int, layer: int, *, seq_len: int,
                eager: bool) -> tuple[int, int]:
    """An MoE decoder with dense layers and a router weight copy (DeepSeek, Qwen-MoE); plain
    ``num_layers x layer`` without MoE facts (Mixtral)."""
    if shape.moe is None:
        return shape.num_layers * layer, layer
    n_dense = shape.moe.num_dense_layers
    dense = tokens * decoder_layer_per_token(shape, dt, seq_len=seq_len, eager=eager, dense=True) if n_dense else 0
    copy = moe_acts.router_weight_copy_bytes(dt.residual, hidden=shape.hidden_size,
                                             experts=shape.num_experts or 0, moe=shape.moe)
    return (shape.num_layers - n_dense) * (layer + copy) + n_dense * dense, max(layer + copy, dense)


def _moe_kept_width(shape: ActivationShape) -> int:
    """Selective checkpointing's kept products of an MoE block (0 with latent attention: not read)."""
    if shape.mla is not None:
        return 0
    return moe_acts.selective_kept_width(q_out=shape.num_attention_heads * shape.head_dim,
                                         kv_out=shape.num_kv_heads * shape.head_dim,
                                         experts=shape.num_experts, moe=shape.moe)


def _moe_backward(shape: ActivationShape, dt: Dtypes, tokens: int, *, checkpointing: bool = False) -> tuple[int, int]:
    """An MoE MLP: its experts' and its routing product's backward (backward_temp, early), all tokens
    (``checkpointing``: the block was recomputed, ``activations_moe.routing_backward_per_token``)."""
    per_token = moe_acts.moe_backward_per_token(
        moe_acts.experts_bytes(dt.compute, dt.residual, input_casts=dt.input_casts), dt.residual,
        hidden=shape.hidden_size, inter=shape.intermediate_size, k=shape.num_experts_per_token or 1,
        moe=shape.moe or MoeFacts(router="softmax"),  # Mixtral: softmax, renormalised, fp32 weights
        recomputed=checkpointing)
    return tuple(tokens * t for t in per_token)


def _qwen_vl_tower(spec: ModelSpec, dt: Dtypes, *, micro_batch_size: int, images: int) -> int:
    """Qwen2-VL / Qwen2.5-VL's tower: merge^2 patches an image token (advisor.estimate.activations_vision)."""
    if spec.vision is None:
        return 0
    return micro_batch_size * vision_saved_bytes(dt.compute, spec.vision, image_tokens=images,
                                                 residual=dt.residual, input_casts=dt.input_casts)


def _llava_tower(spec: ModelSpec, dt: Dtypes, *, micro_batch_size: int, images: int) -> int:
    """Llava's CLIP tower and projector, with autocast's saved bf16 weight copies (activations_llava)."""
    if spec.vision is None:
        return 0
    tower = _qwen_vl_tower(spec, dt, micro_batch_size=micro_batch_size, images=images)
    return tower + (clip_weight_casts(spec.vision) if dt.input_casts else 0)


# -- the registry -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ActivationKind:
    """The activation side of one ``BlockKind`` (same name)."""

    name: str
    shape: Callable[[ModelSpec], dict]  # ActivationShape's fields, but the note
    note: Callable[[ModelSpec], str | None] = lambda spec: None
    layer: Callable[..., int] = decoder_layer_per_token  # one block's saved bytes a token (shape, dt, seq_len, eager)
    whole: Callable[..., dict[str, int]] | None = None  # the whole estimate, composed apart (adapters too)
    layers: Callable[..., tuple[int, int]] | None = None  # (all blocks, the largest); None: num_layers x layer
    backward: Callable[..., tuple[int, int]] | None = None  # (backward_temp, early) of a block; None: the MLP's
    kept_width: Callable[..., int] | None = None  # selective checkpointing's kept products, when not given
    frozen_base: bool = False  # LoRA's frozen-base block formula applies (activations_blocks, Llama-like dense)
    frozen_layer: Callable[..., int] | None = None  # a frozen block of its own under LoRA (shape, dt, adapters, seq_len,
    # eager); the rest of the count stays the full fine-tune's
    eager_softmax: Callable[..., bool] = lambda shape: False  # eager_backward_per_token describes its block
    eager_remaining: Callable[..., int] | None = None  # what it holds at that backward (shape, dt, seq_len); None: the
    # Llama block's (eager_remaining_per_token, with its adapters and checkpointing)
    one_op_mlp: Callable[..., bool] = lambda shape: False  # its MLP is fc1 / one activation op / fc2
    tower: Callable[..., int] | None = None  # a vision tower's saved bytes (spec, dt, micro_batch_size, images)


def _formula(family: str) -> Callable[[ModelSpec], dict]:
    return lambda spec: _spec_fields(spec, family)


def _decoder(name: str, shape: Callable[[ModelSpec], dict] | None = None, **row) -> ActivationKind:
    """A kind whose language model is a Llama-like dense decoder (the frozen-base formula and eager attention's
    softmax backward apply) unless ``row`` says otherwise."""
    return ActivationKind(name, shape or _formula("decoder"),
                          **{"frozen_base": True, "eager_softmax": lambda shape: shape.mla is None, **row})


def _moe_note(spec: ModelSpec) -> str:
    return "; ".join(n for n in (moe_acts.MOE_NOTE, moe_acts.MLA_NOTE if spec.mla else None) if n)


ACTIVATION_KINDS: dict[str, ActivationKind] = {row.name: row for row in (
    ActivationKind("mamba", _mamba_fields, note=lambda spec: SSM_NOTE, layer=mamba_layer_per_token),
    ActivationKind("encdec", _formula("encdec"), whole=_encdec,
                   note=lambda spec: BART_NOTE if spec.encdec.kind == "bart" else ENCDEC_NOTE),
    _decoder("unknown", note=lambda spec: (
        f"no activation formula for {_what(spec)}; activations assume a Llama-like decoder of its language model "
        f"({_known(spec)}); parts outside it (a vision tower, if any) add none")),
    _decoder("qwen_vl", note=lambda spec: vision_note(spec.model_type, spec.vision), tower=_qwen_vl_tower),
    _decoder("llava", note=lambda spec: vision_note(spec.model_type, spec.vision), tower=_llava_tower),
    _decoder("jamba", note=lambda spec: JAMBA_NOTE, layers=_jamba_layers, frozen_base=False,
             eager_softmax=lambda shape: False),
    _decoder("moe", note=_moe_note, layers=_moe_layers, backward=_moe_backward, kept_width=_moe_kept_width,
             frozen_base=False),
    ActivationKind("gpt2", _formula("gpt2"), layer=encoder_layer_per_token,
                   one_op_mlp=lambda shape: shape.one_op_mlp_act),
    ActivationKind("bert", _formula("bert"), layer=encoder_layer_per_token, eager_softmax=lambda shape: True,
                   eager_remaining=encoder_eager_remaining_per_token, frozen_layer=frozen_encoder_layer_per_token),
    ActivationKind("gpt_neox", _formula("gpt_neox"), layer=neox_layer_per_token, one_op_mlp=lambda shape: True),
    _decoder("decoder"),
    _decoder("size", shape=_size_fields, note=lambda spec: SIZE_ONLY_NOTE),
    ActivationKind("none", _no_embedding_fields, whole=_not_modelled, note=lambda spec: (
        f"no token embeddings: activations are not modelled for {spec.architecture or _what(spec)}; the estimate "
        "counts model states only")),
    _decoder("guessed", shape=_guessed_fields, note=lambda spec: (
        f"no activation formula for {_what(spec)}; activations assume a Llama-like decoder with the config's "
        f"{_known(spec)}, the rest guessed")),
)}
assert tuple(ACTIVATION_KINDS) == tuple(kind.name for kind in KINDS), "one activation row per block kind, in order"


def activation_kind(spec: ModelSpec) -> ActivationKind:
    """The activation row of the spec's block kind (``advisor.model.block_kinds.kind_of``)."""
    return ACTIVATION_KINDS[kind_of(spec).name]


def row_of(shape: ActivationShape) -> ActivationKind:
    """The activation row a shape was built by (a shape built by hand names no kind: its family's row)."""
    return ACTIVATION_KINDS[shape.kind or shape.family]
