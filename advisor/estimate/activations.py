"""Activation memory: the tensors autograd saves for backward, per micro-batch, from the
architecture; and the logits/loss transient at the start of backward.

The decoder formula counts what Hugging Face's Llama-style modeling code saves (RMSNorm in fp32,
RoPE, SDPA, gated MLP), so it depends on the dtype of the residual stream (fp32 under autocast
with fp32 weights, bf16 when the weights themselves are bf16, as with FSDP2's MixedPrecisionPolicy
or DeepSpeed) and on whether each linear layer makes its own bf16 copy of an fp32 input (autocast
does not cache casts of activations). Sources: Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", section 4) for the method; the saved tensors of each op
from PyTorch's derivatives.yaml. GPT-2 and BERT use the same method with their LayerNorm, GELU and
dropout; GPT-NeoX (parallel residual, fused QKV, partial rotary) has its own formula. The saved
tensors were listed with ``torch.autograd.graph.saved_tensors_hooks`` on each family and the totals
validated against PyTorch's own execution by the simulator (``advisor simulate``,
``benchmarks/accuracy.py``). A language model of another family (Mamba, Llava's language model)
is treated as a Llama-like decoder of its own vocabulary, width and depth, and the shape says so
(``ActivationShape.note``); a model without token embeddings (ViT, ResNet, Wav2Vec2, CLIP, any
``nn.Module``) has no activation model: its estimate counts model states only.

All functions are pure: integers in, integer bytes out.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate import activations_moe as moe_acts
from advisor.estimate.activations_encdec import BART_NOTE, ENCDEC_NOTE, estimate_encdec_activations
from advisor.estimate.activations_hybrid import JAMBA_NOTE, hybrid_layers_per_token
from advisor.estimate.activations_ssm import SSM_NOTE, mamba_mixer_per_token
from advisor.estimate.activations_vision import vision_note
from advisor.model.kinds import EncDecFacts, SsmFacts
from advisor.model.bundled import load_architectures
from advisor.model.hybrid import HybridFacts
from advisor.model.moe import MlaFacts, MoeFacts
from advisor.model.spec import ModelSpec

FP32 = 4
BOOL = 1
INT64 = 8


class ActivationShape(BaseModel):
    """The shape fields the activation model needs (from a spec, or assumed for a bare size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=0, description="0: no token embeddings (family 'none').")
    family: str = Field(description="decoder (Llama-like), gpt2, bert, gpt_neox, mamba, encdec (T5, BART), or none (not modelled)")
    num_experts: int | None = None
    num_experts_per_token: int | None = None
    moe: MoeFacts | None = Field(default=None, description="Router kind, shared and dense layers (MoE).")
    mla: MlaFacts | None = Field(default=None, description="Multi-head latent attention (DeepSeek).")
    qk_norm: bool = Field(default=False, description="Per-head RMSNorm on q and k (Qwen3).")
    ssm: SsmFacts | None = Field(default=None, description="Mamba mixer widths (family 'mamba').")
    encdec: EncDecFacts | None = Field(default=None, description="Encoder/decoder depths (family 'encdec').")
    hybrid: HybridFacts | None = Field(default=None, description="Attention / Mamba layer pattern (Jamba).")
    assumed: bool = Field(default=False, description="Some shape fields invented from the size.")
    note: str | None = Field(default=None, description="What is assumed or not modelled, for the user.")


class Dtypes(BaseModel):
    """Byte widths that decide activation sizes under a given recipe."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    residual: int = Field(description="Bytes of the residual stream (4 under autocast with fp32 weights).")
    compute: int = Field(description="Bytes of matmul outputs (2 for bf16/fp16).")
    input_casts: bool = Field(description="Each linear makes its own low-precision copy of an fp32 input.")
    buffer: int = Field(default=2, description="Bytes of a model buffer (BART's final_logits_bias): 4 unless the "
                        "engine casts the whole module (pure bf16, DeepSpeed); FSDP2 and autocast cast no buffer.")


class Adapters(BaseModel):
    """LoRA adapters on a frozen base, as the activation model needs them: the rank, whether
    dropout runs on their input, and each adapted linear's input width and source in one block
    (``advisor.model.lora.adapter_inputs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=1)
    dropout: bool
    inputs: tuple[tuple[int, str], ...] = Field(description="(in_features, source) per adapted linear in a block.")


class ActivationEstimate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    saved_bytes: int = Field(description="Saved for backward at the end of forward (all layers, or block inputs).")
    logits_bytes: int = Field(description="Logits, their fp32 copy and the log-softmax output at the end of forward.")
    loss_transient_bytes: int = Field(description="fp32 log-softmax output and its gradients at loss backward.")
    layer_bytes: int = Field(description="One block's saved tensors (what checkpointing recomputes).")
    recompute_bytes: int = Field(default=0, description="What a checkpointed block's backward recomputes: the "
                                 "whole block, less what selective checkpointing kept.")
    backward_temp_bytes: int = Field(description="Gradients alive inside one block's backward.")
    returned_logits_bytes: int = Field(description="The low-precision logits alone (what a model returns).")


_OWN_FORMULA = {"gpt2": "gpt2", "bert": "bert", "gpt_neox": "gpt_neox", "mamba": "mamba"}
_VISION_LANGUAGE = ("qwen2_5_vl", "qwen2_vl", "llava")
SIZE_ONLY_NOTE = "only the size is known: activations assume a Llama-like shape; pass a config for exact figures"


def activation_family(model_type: str | None) -> str | None:
    """The formula written for ``model_type``: its own, or the decoder one for the Llama-like
    families whose module tree ``profiles/architectures.json`` maps to the decoder count; else None."""
    if model_type in _OWN_FORMULA:
        return _OWN_FORMULA[model_type]
    info = load_architectures().get(model_type or "")
    # Qwen-MoE and DeepSeek are Llama-like decoders with an MoE MLP (advisor.estimate.activations_moe).
    # Qwen2.5-VL's language model is a Qwen2 decoder (its vision tower: VISION_NOTE).
    return "decoder" if info is not None and info.formula in ("decoder", "qwen_moe", "deepseek", "qwen_vl", "llava", "jamba") else None


def _info_qk_norm(model_type: str | None) -> bool:
    info = load_architectures().get(model_type or "")
    return info is not None and info.qk_norm


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


def _known(spec: ModelSpec) -> str:
    parts = [f"vocabulary {spec.vocab_size:,}" if spec.vocab_size else None,
             f"width {spec.hidden_size:,}" if spec.hidden_size else None,
             f"{spec.num_layers} layers" if spec.num_layers else None]
    return ", ".join(p for p in parts if p)


def shape_of(spec: ModelSpec) -> ActivationShape:
    """The spec's own shape; for a bare size an assumed Llama-like one; for a language model of a
    family with no formula, a Llama-like decoder of its own vocabulary, width and depth; for a
    model without token embeddings, no activation model (family 'none'). ``note`` says which."""
    family = activation_family(spec.model_type)
    what = f"model_type {spec.model_type}" if spec.model_type else (spec.architecture or "this model")
    if spec.ssm is not None and None not in (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.vocab_size):
        return ActivationShape(num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=1,
                               num_kv_heads=1, head_dim=1, intermediate_size=spec.intermediate_size,
                               vocab_size=spec.vocab_size, family="mamba", ssm=spec.ssm, note=SSM_NOTE)
    if spec.has_architecture:
        heads = spec.num_attention_heads
        note = None
        if spec.encdec is not None:  # T5, BART: advisor.estimate.activations_encdec
            note, family = (BART_NOTE if spec.encdec.kind == "bart" else ENCDEC_NOTE), "encdec"
        elif family is None and spec.model_type is not None:
            note = (f"no activation formula for {what}; activations assume a Llama-like decoder of its "
                    f"language model ({_known(spec)}); parts outside it (a vision tower, if any) add none")
        elif spec.model_type in _VISION_LANGUAGE:
            note = vision_note(spec.model_type)
        elif spec.hybrid is not None:
            note = JAMBA_NOTE
        elif spec.num_experts:
            note = "; ".join(n for n in (moe_acts.MOE_NOTE, moe_acts.MLA_NOTE if spec.mla else None) if n)
        return ActivationShape(
            num_layers=spec.num_layers,
            hidden_size=spec.hidden_size,
            num_attention_heads=heads,
            num_kv_heads=spec.num_kv_heads or heads,
            head_dim=spec.head_dim or spec.hidden_size // heads,
            intermediate_size=spec.intermediate_size or 4 * spec.hidden_size,
            vocab_size=spec.vocab_size,
            family=family or "decoder",
            num_experts=spec.num_experts,
            num_experts_per_token=spec.num_experts_per_token,
            moe=spec.moe,
            mla=spec.mla,
            qk_norm=bool(family == "decoder" and _info_qk_norm(spec.model_type)),
            encdec=spec.encdec if family == "encdec" else None,
            hybrid=spec.hybrid,
            note=note,
        )
    guess = _size_shape(spec.total_params)
    if spec.source == "params":
        return ActivationShape(**guess, family="decoder", assumed=True, note=SIZE_ONLY_NOTE)
    fields, guessed = _own_fields(spec, guess)
    if spec.vocab_size is None:
        note = (f"no token embeddings: activations are not modelled for {spec.architecture or what}; "
                "the estimate counts model states only")
        return ActivationShape(**{**fields, "vocab_size": 0}, family="none", assumed=guessed, note=note)
    note = (f"no activation formula for {what}; activations assume a Llama-like decoder with the config's "
            f"{_known(spec)}, the rest guessed")
    return ActivationShape(**fields, family="decoder", assumed=True, note=note)


def _rms_norm_per_token(h: int, dt: Dtypes) -> int:
    """HF RMSNorm: ``x.to(fp32)`` is saved by ``pow`` and ``mul`` (the residual itself when it is
    fp32), ``rsqrt`` output (4 bytes/token, ignored); ``weight * x_norm.to(input_dtype)`` saves the
    normalised tensor in the residual dtype; its output is saved by the next linear unless autocast
    casts (then the cast copies are counted as ``casts``)."""
    return FP32 * h + dt.residual * h + (0 if dt.input_casts else dt.residual * h)


def _upcast_probs_bytes(dt: Dtypes) -> int:
    """Bytes per attention score that eager attention with ``softmax(dtype=float32).to(query.dtype)``
    (Llama, GPT-NeoX) saves: the fp32 output, plus its copy when the compute dtype is narrower."""
    return FP32 + (dt.compute if dt.compute != FP32 else 0)


def _cuda_math_sdpa(shape: ActivationShape, dt: Dtypes) -> bool:
    """SDPA that CUDA runs with its math kernel, which saves what eager attention saves: fp32 inputs
    with grouped-query attention (flash attention takes only 16-bit inputs, and the memory-efficient
    kernel does not take ``enable_gqa``). Measured on an H100 (torch 2.11, transformers 5.17): a tiny
    fp32 GQA Llama block saved 7,432 bytes a token, as eager does, where the flash count gives 5,136.
    The CPU simulator does not show it: the CPU's flash kernel takes fp32 and GQA."""
    return dt.compute == FP32 and shape.num_kv_heads < shape.num_attention_heads


def _attention_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """Bytes one token leaves saved in a Llama-style block's attention (q, k, v to the output; the
    norm before it and the input casts are the block's). Latent attention: ``advisor.estimate.activations_moe``."""
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    cb = dt.compute
    if shape.mla is not None:
        return moe_acts.mla_attention_per_token(cb, heads=shape.num_attention_heads, mla=shape.mla,
                                                seq_len=seq_len, eager=eager)
    if eager or _cuda_math_sdpa(shape, dt):
        # matmul saves q and (repeated) k; softmax(dtype=fp32) saves its fp32 output, and the AV
        # matmul its copy in the compute dtype (``.to(query.dtype)``: the same tensor under fp32); v repeated.
        attn = cb * 3 * q + _upcast_probs_bytes(dt) * shape.num_attention_heads * seq_len + cb * q
    else:
        # SDPA (flash) saves q, k, v (post-RoPE, low precision; GQA k/v unrepeated: HF passes
        # enable_gqa), its output and the fp32 logsumexp. The output is allocated (b, s, heads, d)
        # and returned transposed, so o_proj's input (transpose + reshape) is a view of it: once.
        attn = cb * q + 2 * cb * kv + cb * q + FP32 * shape.num_attention_heads
    if shape.qk_norm:  # RMSNorm on q and k: their fp32 copies and the normalised values (input dtype)
        attn += (FP32 + cb) * (q + kv)
    return attn


def _decoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool,
                             dense: bool = False) -> int:
    """Bytes one token leaves saved in one Llama-style block (``dense``: an MoE model's dense layer).
    MoE MLPs and latent attention: ``advisor.estimate.activations_moe``."""
    h, I = shape.hidden_size, shape.intermediate_size
    cb = dt.compute
    norms = 2 * _rms_norm_per_token(h, dt)
    casts = 5 * cb * h if dt.input_casts else 0  # q,k,v and gate,up each cast their input
    attn = _attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
    mlp = 4 * cb * I  # gate out, act(gate), up out, act*up
    if dense and shape.moe is not None:
        mlp = 4 * cb * shape.moe.dense_intermediate_size
    elif shape.num_experts:
        facts = shape.moe or MoeFacts(router="softmax")  # Mixtral: softmax, renormalised, fp32 weights
        mlp = moe_acts.moe_mlp_per_token(cb, dt.residual, hidden=h, inter=I, experts=shape.num_experts,
                                         k=shape.num_experts_per_token or 1, moe=facts)
    return norms + casts + attn + mlp


def _moe_layers_total(shape: ActivationShape, dt: Dtypes, tokens: int, layer: int, *, seq_len: int,
                      eager: bool) -> tuple[int, int]:
    """(all blocks' saved bytes, the largest block's) for an MoE decoder with dense layers and a
    router weight copy; plain ``num_layers x layer`` otherwise."""
    if shape.hybrid is not None:  # Jamba: each layer as its kind is (advisor.estimate.activations_hybrid)
        per_layer = hybrid_layers_per_token(shape, dt, seq_len=seq_len, eager=eager,
                                            decoder_layer=_decoder_layer_per_token, attention=_attention_per_token)
        return tokens * sum(per_layer), tokens * max(per_layer)
    if shape.moe is None:
        return shape.num_layers * layer, layer
    n_dense = shape.moe.num_dense_layers
    dense = tokens * _decoder_layer_per_token(shape, dt, seq_len=seq_len, eager=eager, dense=True) if n_dense else 0
    copy = moe_acts.router_weight_copy_bytes(dt.residual, hidden=shape.hidden_size,
                                             experts=shape.num_experts or 0, moe=shape.moe)
    return (shape.num_layers - n_dense) * (layer + copy) + n_dense * dense, max(layer + copy, dense)


def _frozen_decoder_layer_per_token(shape: ActivationShape, dt: Dtypes, ad: Adapters, *, seq_len: int,
                                    eager: bool) -> int:
    """One Llama-style block of a frozen base with LoRA adapters. Autograd saves a tensor only for a
    gradient it will compute, so with every base weight frozen (PEFT freezes norms too) the linears
    save no input and RMSNorm's final ``weight * x`` saves nothing: what stays is what the input
    gradient needs (RMSNorm's fp32 input, RoPE and SDPA's tensors, the gated MLP's three wide
    tensors). Each adapter then saves its own input (``lora_A``), its dropout mask (bool, CUDA's
    fused dropout) and ``x A`` (``lora_B``'s input). ``lora_A``'s input under autocast is its own
    low-precision cast (PEFT first casts to the adapter's fp32 dtype, so even a bf16 input is
    copied); without casts, adapters without dropout share the tensor they read, which is new
    memory except for o_proj's input (SDPA's saved output). Measured per token and layer with
    ``saved_tensors_hooks`` on a 256-wide Llama under PEFT 0.21 (q,v and all-linear; fp32 and
    autocast): equal to this count within 8 bytes (the rsqrt term, left out as in the full count)."""
    h, I, cb = shape.hidden_size, shape.intermediate_size, dt.compute
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    base = 2 * FP32 * h + 3 * cb * I
    if eager:
        base += cb * 3 * q + (FP32 + cb) * shape.num_attention_heads * seq_len + cb * q
    else:
        base += cb * q + 2 * cb * kv + cb * q + FP32 * shape.num_attention_heads
    width = {"attn_norm": dt.residual, "mlp_norm": dt.residual, "attention": cb, "mlp_act": cb}
    adapters = len(ad.inputs) * cb * ad.rank
    if ad.dropout:
        adapters += sum(BOOL * fan_in for fan_in, _ in ad.inputs)
    if dt.input_casts:
        adapters += sum(cb * fan_in for fan_in, _ in ad.inputs)
    elif ad.dropout:
        adapters += sum(width[source] * fan_in for fan_in, source in ad.inputs)
    else:
        shared = {source: fan_in for fan_in, source in ad.inputs if source != "attention"}
        adapters += sum(width[source] * fan_in for source, fan_in in shared.items())
    return base + adapters


def _encoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """GPT-2 / BERT block: two LayerNorms, fused-QKV MHA with biases, GELU MLP, two dropouts."""
    h, I, heads = shape.hidden_size, shape.intermediate_size, shape.num_attention_heads
    cb = dt.compute
    # LayerNorm saves its input (mean/rstd are tiny); the next linear saves the output, or under
    # autocast its bf16 cast (CUDA runs layer_norm in fp32, so the fp32 output itself is not saved).
    layer_norms = 2 * (dt.residual * h + cb * h)
    if eager:
        # QK^T saves q and k, AV the dropped-out probabilities and v (q, k, v: views of the 3h buffer).
        # Softmax saves its output, in fp32 only under autocast (HF's GPT-2/BERT eager attention does
        # not upcast); dropout its bool mask. Without autocast this is Korthikanti et al.'s 5as^2b.
        softmax = FP32 if dt.input_casts else cb
        attn = cb * 3 * h + (softmax + BOOL + cb) * heads * seq_len
    else:
        # q, k, v are views of the fused c_attn output (one 3h buffer); SDPA adds output + fp32 lse.
        attn = cb * 3 * h + FP32 * heads + cb * h
    o_in = cb * h  # the merged heads, made contiguous for the output projection
    dropout_masks = 2 * BOOL * h  # attention-output and MLP-output dropout (native_dropout: bool mask)
    if shape.family == "gpt2":
        # gelu_new, Python ops: pow saves its input (cast to fp32 under CUDA autocast), tanh saves its
        # fp32 output, (1 + tanh) and 0.5 * x are saved by the final mul, whose output fc2 casts.
        wide = FP32 if dt.input_casts else cb
        mlp = 3 * wide * I + 2 * cb * I
    else:
        mlp = 2 * cb * I  # F.gelu saves its input; fc2 saves the output
    return layer_norms + attn + o_in + dropout_masks + mlp


def _neox_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """GPT-NeoX block (parallel residual, partial rotary), read from transformers' modeling_gpt_neox:
    both LayerNorms read the same residual input (saved once); the fused QKV output is kept whole
    (v is a view of it) besides the rotated q and k; SDPA output, lse and the dense input; F.gelu MLP."""
    h, I, heads = shape.hidden_size, shape.intermediate_size, shape.num_attention_heads
    cb = dt.compute
    norms = dt.residual * h + 2 * cb * h  # shared input; each LayerNorm's output (or its cast)
    if eager:
        attn = cb * 3 * h + 2 * cb * h + _upcast_probs_bytes(dt) * heads * seq_len + cb * h
    else:
        attn = cb * 3 * h + 2 * cb * h + FP32 * heads + cb * h + cb * h
    return norms + attn + 2 * cb * I


def _mamba_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """A Mamba block: its RMSNorm (as the decoder's) and the mixer (``advisor.estimate.activations_ssm``)."""
    assert shape.ssm is not None
    return _rms_norm_per_token(shape.hidden_size, dt) + mamba_mixer_per_token(
        dt.compute, hidden=shape.hidden_size, inner=shape.intermediate_size, ssm=shape.ssm, seq_len=seq_len)


def _outside_norm_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    h = shape.hidden_size
    if shape.family == "mamba":  # final RMSNorm and the head's input cast; no rotary tables
        return _rms_norm_per_token(h, dt) + (dt.compute * h if dt.input_casts else 0)
    if shape.family == "decoder":
        # RMSNorm + head input cast; RoPE cos/sin (residual dtype) are shared by every block (Jamba has none).
        rope = 0 if shape.hybrid is not None else 2 * dt.residual * shape.head_dim
        return _rms_norm_per_token(h, dt) + (dt.compute * h if dt.input_casts else 0) + rope
    # Final LayerNorm saves its input; the head saves its output (or its cast); GPT-2 and BERT
    # drop out the embeddings (bool mask); GPT-NeoX's rotary cos/sin are shared by every block.
    dropout = BOOL * h if shape.family in ("gpt2", "bert") else 0
    rotary = 2 * dt.residual * shape.head_dim if shape.family == "gpt_neox" else 0
    return dt.residual * h + dt.compute * h + dropout + rotary


def _selective_kept_per_token(shape: ActivationShape, dt: Dtypes, kept_width: int) -> int:
    """Bytes a token keeps in one block under selective checkpointing beyond the block input: the
    attention kernel's output and fp32 log-sum-exp, and the outputs (``kept_width`` features) of the
    matrix products the policy keeps (``advisor.model.lora.selective_kept_linears``)."""
    q = shape.num_attention_heads * shape.head_dim
    return dt.compute * (q + kept_width) + FP32 * shape.num_attention_heads


def estimate_activations(
    shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int, checkpointing: bool, eager: bool,
    adapters: Adapters | None = None, loss_kernel: str = "hf", selective: bool = False, kept_width: int = 0,
    target_len: int | None = None,
) -> ActivationEstimate:
    """Saved activations of one micro-batch at the end of forward, and the loss transient.
    ``adapters``: LoRA on a frozen base (Llama-like dense decoders; other families keep the full
    fine-tune count, an overestimate, and the plan says so)."""
    if shape.family == "none":  # no token embeddings: not modelled (the shape's note says so)
        return ActivationEstimate(saved_bytes=0, logits_bytes=0, loss_transient_bytes=0, layer_bytes=0,
                                  backward_temp_bytes=0, returned_logits_bytes=0)
    if shape.family == "encdec":  # both stacks (advisor.estimate.activations_encdec); target length default: seq_len
        return ActivationEstimate(**estimate_encdec_activations(
            shape, dt, micro_batch_size=micro_batch_size, src_len=seq_len, tgt_len=target_len or seq_len,
            checkpointing=checkpointing, eager=eager))
    tokens = micro_batch_size * seq_len
    h, vocab = shape.hidden_size, shape.vocab_size
    if adapters is not None and shape.family == "decoder" and not shape.num_experts:
        layer = tokens * _frozen_decoder_layer_per_token(shape, dt, adapters, seq_len=seq_len,
                                                         eager=eager or _cuda_math_sdpa(shape, dt))
        # Frozen embedding, final norm and head: only the labels (nll_loss) and the RoPE tables stay,
        # and the final norm's fp32 input (its input gradient).
        outside = tokens * (INT64 + FP32 * h + 2 * dt.residual * shape.head_dim)
    else:
        per_layer = {"decoder": _decoder_layer_per_token, "gpt_neox": _neox_layer_per_token,
                     "mamba": _mamba_layer_per_token}.get(
            shape.family, _encoder_layer_per_token)
        layer = tokens * per_layer(shape, dt, seq_len=seq_len, eager=eager)
        # Outside the blocks: token ids (embedding backward) and the shifted int64 labels (nll_loss),
        # the final norm and the head's input (its autocast cast, or the norm output).
        outside = tokens * (2 * INT64 + _outside_norm_per_token(shape, dt))
    layers_total, layer = _moe_layers_total(shape, dt, tokens, layer, seq_len=seq_len, eager=eager)
    if checkpointing:
        # Non-reentrant checkpointing keeps each block's input; one block is recomputed at a time
        # in backward (``layer_bytes``, added by the memory model at that moment, not here).
        kept = _selective_kept_per_token(shape, dt, kept_width) if selective else 0
        saved = tokens * shape.num_layers * (dt.residual * h + kept) + outside
        recompute = layer - tokens * kept
    else:
        saved, recompute = layers_total + outside, 0
    logits, loss = _loss_bytes(loss_kernel, tokens=tokens, vocab=vocab, hidden=h, dt=dt)
    # Inside a block's backward: the incoming and outgoing residual gradients and the MLP's
    # gradients w.r.t. its two widest intermediates (the peak of a gated MLP's backward).
    backward_temp = tokens * (2 * dt.residual * h + 2 * dt.compute * shape.intermediate_size)
    returned = tokens * vocab * dt.compute if loss_kernel == "hf" else 0
    return ActivationEstimate(saved_bytes=saved, logits_bytes=logits, loss_transient_bytes=loss, layer_bytes=layer,
                              backward_temp_bytes=backward_temp, returned_logits_bytes=returned,
                              recompute_bytes=max(0, recompute))


LOSS_CHUNKS = 8  # wrappers.losses.CHUNKS


def _loss_bytes(kernel: str, *, tokens: int, vocab: int, hidden: int, dt: Dtypes) -> tuple[int, int]:
    """(end of forward, loss backward) bytes of the loss path beyond the saved activations.

    hf (transformers' ForCausalLMLoss): the forward ends with the low-precision logits, their fp32
    copy and the saved log-softmax output, 2 + 4 + 4 bytes per logit (the loop keeps only the loss,
    so the logits are freed before backward); loss backward holds the saved log-softmax output, the
    NLL gradient and log_softmax_backward's output, all fp32 (aten derivatives.yaml: log_softmax
    saves ``result``). chunked (``wrappers.losses.chunked_cross_entropy``): each chunk's logits and
    their fp32 copy die with the chunk, only the fp32 log-softmax of every chunk is kept; backward
    adds one chunk's two fp32 gradients and its low-precision one. fused
    (``wrappers.losses.fused_linear_cross_entropy``, Liger's algorithm): one chunk's logits at a time
    (fp32, softmax in place, its low-precision copy; under autocast also a low-precision copy of the
    fp32 head) while the forward computes the input gradient (residual dtype) and the head's
    gradient (an fp32 accumulator, then the head's dtype), which are kept for backward; backward
    makes a scaled copy of each."""
    per_chunk = -(-tokens // LOSS_CHUNKS) * vocab
    if kernel == "chunked":
        return (tokens * vocab * FP32 + per_chunk * (dt.compute + FP32),
                tokens * vocab * FP32 + per_chunk * 2 * FP32)
    if kernel == "fused":
        head = vocab * hidden
        grad_input = tokens * hidden * dt.residual
        in_loop = grad_input + head * FP32 + per_chunk * (FP32 + dt.compute)
        if dt.input_casts:  # autocast over an fp32 head: one low-precision copy of it for the chunks
            in_loop += head * dt.compute
        # After the loop the accumulator becomes the head's dtype (a copy unless that is fp32).
        at_end = grad_input + head * FP32 + (head * dt.residual if dt.residual != FP32 else 0)
        kept = grad_input + head * dt.residual
        return max(in_loop, at_end), 2 * kept
    return tokens * vocab * (dt.compute + 2 * FP32), tokens * vocab * 3 * FP32
