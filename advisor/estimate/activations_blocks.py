"""What one token leaves saved in one block, per family: the per-token formulas that
``advisor.estimate.activations.estimate_activations`` multiplies by tokens and layers.

Here: the Llama-style decoder block (RMSNorm, attention, gated or MoE MLP), its frozen-base LoRA
form, the GPT-2 / BERT block, the GPT-NeoX block, the Mamba block, what the final norm and head
keep outside the blocks, and what selective checkpointing keeps. Not here: the shape a spec maps
to and the composition over layers, checkpointing and the loss (``activations.py``), the loss path
(``activations_loss.py``), MoE, latent-attention, Mamba-mixer, Jamba, encoder-decoder and vision
pieces (``activations_moe.py``, ``activations_ssm.py``, ``activations_hybrid.py``,
``activations_encdec.py``, ``activations_vision.py``).

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
``benchmarks/accuracy.py``).

Pure functions: integers in, integer bytes per token out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.estimate import activations_moe as moe_acts
from advisor.estimate.activations_ssm import mamba_mixer_per_token
from advisor.model.moe import MoeFacts
from advisor.precision import FP32

if TYPE_CHECKING:  # the input models live with the composition that builds them
    from advisor.estimate.activations import ActivationShape, Adapters, Dtypes

BOOL = 1


def rms_norm_per_token(h: int, dt: Dtypes) -> int:
    """HF RMSNorm: ``x.to(fp32)`` is saved by ``pow`` and ``mul`` (the residual itself when it is
    fp32), ``rsqrt`` output (4 bytes/token, ignored); ``weight * x_norm.to(input_dtype)`` saves the
    normalised tensor in the residual dtype; its output is saved by the next linear unless autocast
    casts (then the cast copies are counted as ``casts``)."""
    return FP32 * h + dt.residual * h + (0 if dt.input_casts else dt.residual * h)


def _upcast_probs_bytes(dt: Dtypes) -> int:
    """Bytes per attention score that eager attention with ``softmax(dtype=float32).to(query.dtype)``
    (Llama, GPT-NeoX) saves: the fp32 output, plus its copy when the compute dtype is narrower."""
    return FP32 + (dt.compute if dt.compute != FP32 else 0)


def cuda_math_sdpa(shape: ActivationShape, dt: Dtypes) -> bool:
    """SDPA that CUDA runs with its math kernel, which saves what eager attention saves: fp32 inputs
    with grouped-query attention (flash attention takes only 16-bit inputs, and the memory-efficient
    kernel does not take ``enable_gqa``). Measured on an H100 (torch 2.11, transformers 5.17): a tiny
    fp32 GQA Llama block saved 7,432 bytes a token, as eager does, where the flash count gives 5,136.
    The CPU simulator does not show it: the CPU's flash kernel takes fp32 and GQA."""
    return dt.compute == FP32 and shape.num_kv_heads < shape.num_attention_heads


def window_mask_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int) -> int:
    """A sliding window shorter than the sequence: transformers hands SDPA a boolean (b, 1, s, s) mask
    (``masking_utils.sdpa_mask``; no ``is_causal`` shortcut), which SDPA turns into an additive mask in
    the query's dtype (``convert_boolean_attn_mask``) and saves for backward in every layer: s bytes of
    the compute dtype per token and layer. Measured (advisor.simulate, Mistral layout, s = 2048, window
    1024, bf16-mixed): 2 layers save 17,301,504 bytes more than without the window, 2 x 2 x 2048^2 and
    524,288 of small tensors (``tests/estimate/test_sliding_window.py``)."""
    window = shape.sliding_window
    return seq_len * dt.compute if window is not None and seq_len > window else 0


def attention_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """Bytes one token leaves saved in a Llama-style block's attention (q, k, v to the output; the
    norm before it and the input casts are the block's). Latent attention: ``advisor.estimate.activations_moe``."""
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    cb = dt.compute
    if shape.mla is not None:
        return moe_acts.mla_attention_per_token(cb, heads=shape.num_attention_heads, mla=shape.mla,
                                                seq_len=seq_len, eager=eager)
    if eager or cuda_math_sdpa(shape, dt):
        # matmul saves q and (repeated) k; softmax(dtype=fp32) saves its fp32 output, and the AV
        # matmul its copy in the compute dtype (``.to(query.dtype)``: the same tensor under fp32); v repeated.
        attn = cb * 3 * q + _upcast_probs_bytes(dt) * shape.num_attention_heads * seq_len + cb * q
        if shape.attn_softcap:  # Gemma 2: tanh(scores / cap) saved per head and key (tanh's backward reads it)
            attn += cb * shape.num_attention_heads * seq_len
    else:
        # SDPA (flash) saves q, k, v (post-RoPE, low precision; GQA k/v unrepeated: HF passes
        # enable_gqa), its output and the fp32 logsumexp. The output is allocated (b, s, heads, d)
        # and returned transposed, so o_proj's input (transpose + reshape) is a view of it: once.
        attn = cb * q + 2 * cb * kv + cb * q + FP32 * shape.num_attention_heads
        attn += window_mask_per_token(shape, dt, seq_len=seq_len)
    if shape.qk_norm:  # RMSNorm on q and k: their fp32 copies and the normalised values (input dtype)
        attn += (FP32 + cb) * (q + kv)
    return attn


def decoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool,
                            dense: bool = False) -> int:
    """Bytes one token leaves saved in one Llama-style block (``dense``: an MoE model's dense layer).
    MoE MLPs and latent attention: ``advisor.estimate.activations_moe``."""
    h, I = shape.hidden_size, shape.intermediate_size
    cb = dt.compute
    norms = 2 * rms_norm_per_token(h, dt)
    casts = 5 * cb * h if dt.input_casts else 0  # q,k,v and gate,up each cast their input
    attn = attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
    mlp = 4 * cb * I  # gate out, act(gate), up out, act*up
    if dense and shape.moe is not None:
        mlp = 4 * cb * shape.moe.dense_intermediate_size
    elif shape.num_experts:
        facts = shape.moe or MoeFacts(router="softmax")  # Mixtral: softmax, renormalised, fp32 weights
        mlp = moe_acts.moe_mlp_per_token(cb, dt.residual, hidden=h, inter=I, experts=shape.num_experts,
                                         k=shape.num_experts_per_token or 1, moe=facts)
    return norms + casts + attn + mlp


def frozen_decoder_layer_per_token(shape: ActivationShape, dt: Dtypes, ad: Adapters, *, seq_len: int,
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
        if shape.attn_softcap:  # Gemma 2: tanh(scores / cap), as in attention_per_token
            base += cb * shape.num_attention_heads * seq_len
    else:
        base += cb * q + 2 * cb * kv + cb * q + FP32 * shape.num_attention_heads
        base += window_mask_per_token(shape, dt, seq_len=seq_len)
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
    # DoRA (peft/tuners/lora/dora.py DoraLinearLayer.forward, peft 0.21): (m / ||W + sBA|| - 1) * base_result
    # + (m / ||W + sBA||) * lora_result * s saves both products' tensor operands for the magnitude's gradient:
    # the base layer's output and the adapter's, one out_features-wide tensor each per target.
    adapters += sum(2 * cb * fan_out for fan_out in ad.dora_outputs)
    return base + adapters


def encoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
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


def neox_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
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


def mamba_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """A Mamba block: its RMSNorm (as the decoder's) and the mixer (``advisor.estimate.activations_ssm``)."""
    assert shape.ssm is not None
    return rms_norm_per_token(shape.hidden_size, dt) + mamba_mixer_per_token(
        dt.compute, hidden=shape.hidden_size, inner=shape.intermediate_size, ssm=shape.ssm, seq_len=seq_len)


def outside_norm_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    h = shape.hidden_size
    if shape.family == "mamba":  # final RMSNorm and the head's input cast; no rotary tables
        return rms_norm_per_token(h, dt) + (dt.compute * h if dt.input_casts else 0)
    if shape.family == "decoder":
        # RMSNorm + head input cast; RoPE cos/sin (residual dtype) are shared by every block (Jamba has none).
        rope = 0 if shape.hybrid is not None else 2 * dt.residual * shape.head_dim
        return rms_norm_per_token(h, dt) + (dt.compute * h if dt.input_casts else 0) + rope
    # Final LayerNorm saves its input; the head saves its output (or its cast); GPT-2 and BERT
    # drop out the embeddings (bool mask); GPT-NeoX's rotary cos/sin are shared by every block.
    dropout = BOOL * h if shape.family in ("gpt2", "bert") else 0
    rotary = 2 * dt.residual * shape.head_dim if shape.family == "gpt_neox" else 0
    return dt.residual * h + dt.compute * h + dropout + rotary


def selective_kept_per_token(shape: ActivationShape, dt: Dtypes, kept_width: int) -> int:
    """Bytes a token keeps in one block under selective checkpointing beyond the block input: the
    attention kernel's output and fp32 log-sum-exp, and the outputs (``kept_width`` features) of the
    matrix products the policy keeps (``advisor.model.lora.selective_kept_linears``)."""
    q = shape.num_attention_heads * shape.head_dim
    return dt.compute * (q + kept_width) + FP32 * shape.num_attention_heads
