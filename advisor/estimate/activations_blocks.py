"""What one token leaves saved in one block, per family: the per-token formulas that
``advisor.estimate.activations.estimate_activations`` multiplies by tokens and layers.

Here: the Llama-style decoder block (RMSNorm, attention, gated or MoE MLP; Gemma 2's four norms),
its frozen-base LoRA form, eager attention's masks and softmax backward, the GPT-2 / BERT block,
the GPT-NeoX block, the Mamba block, what the final norm and head keep outside the blocks, and
what selective checkpointing keeps. Not here: the shape a spec maps
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


def fp32_norm_scale_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """What one of Gemma's RMSNorms saves beyond ``rms_norm_per_token`` (``ActivationShape.fp32_norm_scale``): it
    scales by ``(1 + weight)`` in fp32 and casts back (transformers 5.23 modeling_gemma.py ``GemmaRMSNorm``), so the
    normalised tensor is saved in fp32, 4 - residual bytes a channel more. Read on the simulated step (sweep
    31bbc0c6d375: 256-wide Gemma, bf16, s 4096): each norm held ``x.float()`` and ``x * rsqrt`` in fp32 and its bf16
    output. Gemma 2's four norms count it in ``sandwich_norms_per_token``."""
    return (FP32 - dt.residual) * shape.hidden_size if shape.fp32_norm_scale and not shape.sandwich_norms else 0


def _upcast_probs_bytes(dt: Dtypes) -> int:
    """Bytes per attention score that eager attention with ``softmax(dtype=float32).to(query.dtype)``
    (Llama, GPT-NeoX) saves: the fp32 output, plus its copy when the compute dtype is narrower."""
    return FP32 + (dt.compute if dt.compute != FP32 else 0)


def cuda_math_sdpa(shape: ActivationShape, dt: Dtypes) -> bool:
    """SDPA that CUDA runs with its math kernel, which saves what eager attention saves: fp32 inputs
    with grouped-query attention (flash attention takes only 16-bit inputs, and the memory-efficient
    kernel does not take ``enable_gqa``). Measured on an H100 (torch 2.11, transformers 5.17): a tiny
    fp32 GQA Llama block saved 7,432 bytes a token, as eager does, where the flash count gives 5,136.
    The simulator runs the same kernel choice (``advisor.simulate.cuda_kernels``), so it shows it too."""
    return dt.compute == FP32 and shape.num_kv_heads < shape.num_attention_heads


def cuda_math_sdpa_at(shape: ActivationShape, dt: Dtypes, *, seq_len: int) -> bool:
    """``cuda_math_sdpa`` at ``seq_len``: with a sliding window shorter than the sequence transformers
    repeats k and v itself and hands SDPA a mask (``window_mask_per_token``), which the memory-efficient
    kernel takes, so no score matrix is saved (sweep 32d85bbcfb68: +12.5% counted as math, -0.00% not).
    Where it is true the math kernel's softmax backward is counted as eager's (sweep 5e602d9419a7: -45.6%
    without it, +0.06% with it)."""
    return cuda_math_sdpa(shape, dt) and not window_mask_per_token(shape, dt, seq_len=seq_len)


def window_mask_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int) -> int:
    """A sliding window shorter than the sequence: transformers hands SDPA a boolean (b, 1, s, s) mask
    (``masking_utils.sdpa_mask``; no ``is_causal`` shortcut), which SDPA turns into an additive mask in
    the query's dtype (``convert_boolean_attn_mask``) and saves for backward in every layer: s bytes of
    the compute dtype per token and layer. Measured (advisor.simulate, Mistral layout, s = 2048, window
    1024, bf16-mixed): 2 layers save 17,301,504 bytes more than without the window, 2 x 2 x 2048^2 and
    524,288 of small tensors (``tests/estimate/test_sliding_window.py``). A window as long as the
    sequence is no shortcut either: transformers skips the mask only while the keys are fewer than the
    window (``masking_utils._ignore_causal_mask_sdpa``: ``kv_length >= local_attention_size`` keeps it)."""
    window = shape.sliding_window
    return seq_len * dt.compute if window is not None and seq_len >= window else 0


def fused_qkv_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """What Phi-3's attention saves beyond a Llama block's (transformers 5.23 modeling_phi3.py): q, k and v are
    slices of one projection's output (``qkv_proj``), q and k are rotated into new tensors, v stays a view, and a
    view keeps its whole storage (q + kv more elements); the rotation concatenates (its partial-rotary path), so q
    is contiguous per head, SDPA's output follows q's layout (``empty_like``), and o_proj's input, the output
    transposed back, is a copy (a Llama's rotated q keeps the projection's layout: a view). Measured with
    saved_tensors_hooks on a 192-wide Phi-3 (s 512): v 2,304 bytes a token where a Llama block saves 768, and
    o_proj's input 768 more (fp32; half of each under autocast)."""
    if not shape.fused_qkv:
        return 0
    q = shape.num_attention_heads * shape.head_dim
    return dt.compute * (q + shape.num_kv_heads * shape.head_dim) + dt.compute * q


def window_mask_input_bytes(shape: ActivationShape, *, seq_len: int) -> int:
    """The boolean mask itself, made once before the blocks and handed to each: under checkpointing it
    is an input of every checkpointed block, so it stays until the first block's backward (without
    checkpointing nothing saves it: SDPA saves its additive copy, ``window_mask_per_token``). Without a
    padding mask the mask function reads no batch index, so ``masking_utils.sdpa_mask`` builds one
    (1, 1, s, s) mask and ``expand``s it to the batch: s^2 bytes whatever the micro-batch (a padded
    batch's ``attention_mask`` would make it b x s^2; the planned batch has none). Measured
    (advisor.simulate, Mistral layout, selective checkpointing): s 1024, window 512, mb 1: the mask is
    built in three s^2 boolean steps of which one, 1,048,576 bytes, stays; s 2048, mb 2 and 4 keep the
    same 4,194,304 bytes as mb 1 (sweep 8bb54f571d6f: +8.56% when it was counted per sample)."""
    window = shape.sliding_window
    return seq_len * seq_len * BOOL if window is not None and seq_len >= window else 0


def sandwich_norms_per_token(shape: ActivationShape, dt: Dtypes, *, frozen: bool = False) -> int:
    """What Gemma 2's four-norm block saves beyond the two norms ``rms_norm_per_token`` counts
    (transformers 5.23 modeling_gemma2.py ``Gemma2RMSNorm``: ``x.float()``, ``x * rsqrt(...)``, then
    ``* (1.0 + weight.float())`` and ``type_as(x)``). The norms after attention and after the MLP read
    the compute-dtype projection output: its fp32 copy (saved by ``pow`` and ``mul``; the output itself
    in fp32) and the fp32 normalised tensor (saved by ``* (1 + weight)``, which a frozen weight does not
    need), 2 x 4 bytes a channel each. The norms before attention and the MLP keep the normalised
    tensor in fp32 where Llama's keeps it in the residual dtype: 4 - residual bytes more a channel.
    Measured with a live-bytes trace of a fake-tensor step (bf16-mixed): 32 h a token in a block's
    norms where the two-norm count gives 16 h."""
    if not shape.sandwich_norms:
        return 0
    h = shape.hidden_size
    if frozen:
        return 2 * FP32 * h
    return 2 * 2 * FP32 * h + 2 * (FP32 - dt.residual) * h


def eager_masks_bytes(shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int) -> int:
    """The additive float masks eager attention reads: ``masking_utils.eager_mask`` turns the boolean
    mask into 0 / -inf in the embeddings' dtype (the residual dtype), b x 1 x s x s, never skipped for
    eager (``allow_is_causal_skip=False``); Gemma 2 builds a full and a sliding-window one
    (``ActivationShape.eager_masks``). The model's forward holds them while the blocks run; under
    checkpointing each block's recomputation needs its mask, so they live until the blocks' backward
    ends (the checkpoint keeps its inputs). ``attention + mask`` saves neither."""
    return shape.eager_masks * micro_batch_size * seq_len * seq_len * dt.residual


def eager_backward_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, layer: int,
                             remaining: int) -> int:
    """Bytes a token adds, beyond its block's saved tensors (``layer`` of them a token), when eager
    attention's softmax runs backward: the autograd graph of ``eager_attention_forward`` (transformers
    5.23: ``matmul``, ``* scaling``, soft-capping ``/ cap``, ``tanh``, ``* cap``, ``+ mask``,
    ``softmax(dtype=float32)``, ``.to(query.dtype)``, ``matmul``) run backward. The second matmul's
    backward frees the compute-dtype probabilities and the value it saved and leaves the gradient of
    the value (heads x head_dim) waiting for ``v_proj``; ``to``'s backward casts the probabilities'
    gradient to fp32; ``_softmax_backward_data`` then writes an fp32 gradient of the scores beside it, and
    CUDA's kernel first forms ``grad * output`` (aten/src/ATen/native/cuda/SoftMax.cu
    ``softmax_backward_cuda_out``), an fp32 product held while it writes: 3 x 4 bytes per score, while the
    softmax output it reads is still saved (an H100 run reached its peak inside that operator:
    ``advisor.simulate.cuda_kernels.cuda_softmax_backward``). Everything the block saved
    after the softmax (the MLP, the norms after attention, ``o_proj``'s input) was freed by then; what
    the block still holds is ``remaining`` (the input norm, the q/k/v casts, q and k, the softmax output,
    the soft-capping tanh). With the two residual-stream gradients of the block (its output's and the
    one flowing to its input). The later steps (``tanh``'s backward and the casts) hold at most one fp32
    and two compute-dtype scores' worth. Measured with a live-bytes trace of a fake-tensor step (Gemma 2,
    bf16-mixed, s 1024): the step's peak is this moment of the top block."""
    scores = shape.num_attention_heads * seq_len
    q = shape.num_attention_heads * shape.head_dim
    temporaries = 3 * FP32 * scores + dt.compute * q + 2 * dt.residual * shape.hidden_size
    return temporaries - (layer - remaining)


def eager_remaining_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, frozen: bool) -> int:
    """What a block still holds when its eager softmax runs backward (``eager_backward_per_token``): the
    input norm's tensors, the q/k/v input casts, q and (repeated) k saved by ``matmul``, the fp32 softmax
    output and the soft-capping tanh output, the q/k norms. A frozen base keeps only the norm's fp32 input
    of the first three (LoRA adapters on q, k and v: ``frozen_decoder_layer_per_token``)."""
    h, cb = shape.hidden_size, dt.compute
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    scores = shape.num_attention_heads * seq_len
    if frozen:
        norm = FP32 * h
    else:
        norm = rms_norm_per_token(h, dt) + (3 * cb * h if dt.input_casts else 0) + fp32_norm_scale_per_token(shape, dt)
        norm += (FP32 - dt.residual) * h if shape.sandwich_norms else 0
    attn = 2 * cb * q + FP32 * scores + (cb * scores if shape.attn_softcap else 0)
    if shape.qk_norm:
        attn += (FP32 + cb) * (q + kv)
    return norm + attn


def encoder_eager_remaining_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int) -> int:
    """What a BERT block still holds when its eager softmax runs backward (``eager_backward_per_token``): q and k,
    saved by the scores' matmul, and the softmax output (fp32 under autocast). Its LayerNorms, MLP, dropout masks
    and the dropped-out probabilities were freed by their backward; its input belongs to the block below."""
    scores = shape.num_attention_heads * seq_len
    softmax = FP32 if dt.input_casts else dt.compute
    return 2 * dt.compute * shape.num_attention_heads * shape.head_dim + softmax * scores


def attention_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """Bytes one token leaves saved in a Llama-style block's attention (q, k, v to the output; the
    norm before it and the input casts are the block's). Latent attention: ``advisor.estimate.activations_moe``."""
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    cb = dt.compute
    if shape.mla is not None:
        return moe_acts.mla_attention_per_token(cb, heads=shape.num_attention_heads, mla=shape.mla,
                                                seq_len=seq_len, eager=eager)
    if eager or cuda_math_sdpa_at(shape, dt, seq_len=seq_len):
        # matmul saves q and (repeated) k; softmax(dtype=fp32) saves its fp32 output, and the AV
        # matmul its copy in the compute dtype (``.to(query.dtype)``: the same tensor under fp32); v repeated.
        attn = cb * 3 * q + _upcast_probs_bytes(dt) * shape.num_attention_heads * seq_len + cb * q
        if shape.attn_softcap:  # Gemma 2: tanh(scores / cap) saved per head and key (tanh's backward reads it)
            attn += cb * shape.num_attention_heads * seq_len
    else:
        # SDPA (flash) saves q, k, v (post-RoPE, low precision; GQA k/v unrepeated: HF passes
        # enable_gqa), its output and the fp32 logsumexp. The output is allocated (b, s, heads, d)
        # and returned transposed, so o_proj's input (transpose + reshape) is a view of it: once.
        attn = cb * q + 2 * cb * kv + cb * q + FP32 * shape.num_attention_heads + fused_qkv_per_token(shape, dt)
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
    norms = 2 * (rms_norm_per_token(h, dt) + fp32_norm_scale_per_token(shape, dt)) + sandwich_norms_per_token(shape, dt)
    # q,k,v and gate,up each cast their input (Phi-3's fused qkv_proj and gate_up_proj: two linears)
    casts = (2 if shape.fused_qkv else 5) * cb * h if dt.input_casts else 0
    attn = attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
    mlp = 4 * cb * I  # gate out, act(gate), up out, act*up
    if dense and shape.moe is not None:
        mlp = 4 * cb * shape.moe.dense_intermediate_size
    elif shape.num_experts:
        facts = shape.moe or MoeFacts(router="softmax")  # Mixtral: softmax, renormalised, fp32 weights
        mlp = moe_acts.moe_mlp_per_token(cb, dt.residual, hidden=h, inter=I, experts=shape.num_experts,
                                         k=shape.num_experts_per_token or 1, moe=facts,
                                         routed_bytes=moe_acts.experts_bytes(cb, dt.residual, input_casts=dt.input_casts))
        if dt.input_casts:  # autocast casts the router's input, not the experts' (q, k, v, router; a shared expert's two)
            casts = (4 + (2 if facts.shared_intermediate_size else 0)) * cb * h
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
    base = 2 * FP32 * h + 3 * (dt.mlp or cb) * I + sandwich_norms_per_token(shape, dt, frozen=True)
    base += frozen_attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
    return base + frozen_adapters_per_token(dt, ad, eager=eager)


def frozen_attention_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """What a frozen block's attention saves for the input gradient (``frozen_decoder_layer_per_token``):
    RoPE and SDPA's tensors (eager: the matmuls' and softmax's), and Qwen3's q/k norms' fp32 inputs.

    Eager (and CUDA's math SDPA): q and the repeated k and v saved by the two matmuls, the fp32 softmax
    output and its compute-dtype copy (``_upcast_probs_bytes``: none in fp32, where ``.to`` returns the
    tensor itself). Not o_proj's input: the output made contiguous for o_proj is saved only by an adapter
    on o_proj (``frozen_adapters_per_token``), the frozen o_proj saves nothing (flash SDPA saves its output,
    which o_proj reads as a view). Read on the simulated step (sweep a7b943fccdde: 384-wide Gemma, fp32,
    GQA, s 128, DoRA on q and v): 7,680 bytes a token of attention, 3 x 1,536 + 3,072 of softmax, where
    the count gave 12,288."""
    cb = dt.compute
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    if eager:
        base = cb * 3 * q + _upcast_probs_bytes(dt) * shape.num_attention_heads * seq_len
        if shape.attn_softcap:  # Gemma 2: tanh(scores / cap), as in attention_per_token
            base += cb * shape.num_attention_heads * seq_len
    else:
        base = cb * q + 2 * cb * kv + cb * q + FP32 * shape.num_attention_heads + fused_qkv_per_token(shape, dt)
        base += window_mask_per_token(shape, dt, seq_len=seq_len)
    if shape.qk_norm:  # Qwen3's RMSNorm on q and k keeps its fp32 input for the input gradient (weight frozen)
        base += FP32 * (q + kv)
    return base


def frozen_adapters_per_token(dt: Dtypes, ad: Adapters, *, eager: bool = False) -> int:
    """What a block's LoRA / DoRA adapters save a token (``frozen_decoder_layer_per_token``'s docstring).
    ``eager``: the attention saves no output (eager, CUDA's math SDPA), so an o_proj adapter's input is
    its own (``frozen_attention_per_token``), not a view of SDPA's saved output."""
    cb = dt.compute
    width = {"attn_norm": dt.residual, "mlp_norm": dt.residual, "attention": cb, "mlp_act": cb}
    adapters = len(ad.inputs) * (dt.adapter or cb) * ad.rank
    if ad.dropout:
        adapters += sum(BOOL * fan_in for fan_in, _ in ad.inputs)
    if dt.adapter is not None:  # fp32 adapters without autocast: each saves its own fp32 input (or dropout output)
        adapters += sum(dt.adapter * fan_in for fan_in, _ in ad.inputs)
    elif dt.input_casts:
        adapters += sum(cb * fan_in for fan_in, _ in ad.inputs)
    elif ad.dropout:
        adapters += sum(width[source] * fan_in for fan_in, source in ad.inputs)
    else:
        shared = {source: fan_in for fan_in, source in ad.inputs if eager or source != "attention"}
        adapters += sum(width[source] * fan_in for source, fan_in in shared.items())
    # DoRA (peft/tuners/lora/dora.py DoraLinearLayer.forward, peft 0.21): (m / ||W + sBA|| - 1) * base_result
    # + (m / ||W + sBA||) * lora_result * s saves both products' tensor operands for the magnitude's gradient:
    # the base layer's output and the adapter's, one out_features-wide tensor each per target.
    # Where the adapters compute in fp32 (dt.adapter: PEFT casts x to fp32) the adapter's product is fp32, and so is
    # the base product under dropout, which DoRA recomputes from the dropped fp32 input with the base weight cast to
    # it; without dropout DoRA reuses the base layer's own output (compute dtype). Simulated on a tiny Llama
    # (tests/estimate/test_fp32_adapters.py).
    base_product = dt.adapter if dt.adapter is not None and ad.dropout else cb
    adapters += sum((base_product + (dt.adapter or cb)) * fan_out for fan_out in ad.dora_outputs)
    return adapters


def dora_weight_bytes(dt: Dtypes, ad: Adapters, *, tokens: int, quantized: bool = False,
                      checkpointing: bool = False) -> int:
    """The most a DoRA layer's forward holds beyond what the block saves, over the block's adapted linears (peft
    0.21 ``peft/tuners/lora/dora.py`` ``DoraLinearLayer``; nothing cached in training). PEFT casts the layer's
    input to the adapters' dtype (``_cast_input_dtype``: a copy where they differ), and DoRA works in that dtype:
    ``get_lora_weight`` runs ``lora_B(lora_A(eye(in)))``, an ``in x in`` identity that ``lora_A``'s product saves
    for its weight gradient (under autocast a low-precision cast of it, the identity itself freed as the call
    returns), an ``in x r`` and an ``in x out`` product (``.to`` copies the latter where autocast left it in
    low precision); ``weight.to`` copies the base weight where its dtype differs (a 4-bit base is dequantised into
    a new tensor); ``get_weight_norm`` adds ``scaling * lora_weight`` to it (two ``out x in`` tensors) and takes
    the row norms (a reduction, no fp32 copy of a 16-bit sum). All but the norm's temporaries stay referenced until the layer
    returns, where ``(m / norm - 1) * base_result + m / norm * lora_result * scaling`` makes three ``tokens x out``
    products in the magnitude's (the adapters') dtype (counted on the block's last adapted linear: the point the
    block's end, which the activations count, sits closest to), beside the layer's input where nothing saves it (autocast's
    ``lora_A`` saves its own cast, so neither PEFT's copy nor the MLP's product before ``down_proj`` is kept).
    Real-tensor traces of a 384-wide Llama's last block (down projection 1,344 in, 1,024 tokens) measured 7,025,664
    bytes above the block's end in bf16, as counted here, and 18,674,688 under autocast over fp32 weights, which
    the count takes as 20,149,248 (the input copies beside the identity's build: 7.9% above)
    (tests/estimate/test_dora_weight.py). ``checkpointing``: a checkpointed forward saves nothing, so the identity
    lives only inside the call; its recomputation in backward saves as the plain forward does (torch's
    recomputation hook returns each tensor it packs, so the weight's graph keeps the identity until the layer
    returns): the caller counts the recomputation with ``checkpointing`` False."""
    if not ad.dora_outputs:
        return 0
    cb, autocast = dt.compute, dt.input_casts
    adapter = dt.adapter or (FP32 if autocast else cb)  # the adapters' dtype, which DoRA computes in
    products = cb if autocast else adapter  # lora_A's and lora_B's outputs
    cast_eye = cb if autocast and adapter != cb else 0  # autocast's low-precision copy of the identity
    eye_held = 0 if checkpointing else cast_eye or adapter  # what lora_A saves of it
    weight = FP32 if dt.residual == FP32 and (autocast or cb == FP32) else cb  # the base weight's dtype
    width = {"attn_norm": dt.residual, "mlp_norm": dt.residual, "attention": cb, "mlp_act": dt.mlp or cb}
    worst, last = 0, len(ad.inputs) - 1
    for index, ((fan_in, source), fan_out) in enumerate(zip(ad.inputs, ad.dora_outputs)):
        x, eye, wide = width[source], fan_in * fan_in, fan_in * fan_out
        low = 0 if checkpointing else fan_in * ad.rank * products  # lora_B saves it
        # the layer's input, live through the whole call where nothing saves it: PEFT's copy in the adapters'
        # dtype (autocast's lora_A saves its own cast of it; a checkpointed forward saves nothing) and the MLP's
        # product before down_proj (lora_A saves the input itself only in one dtype, without autocast or dropout)
        kept = not (autocast or checkpointing or ad.dropout) and adapter == x
        copy = tokens * fan_in * adapter if adapter != x and (autocast or checkpointing) else 0
        inputs = copy + (tokens * fan_in * x if source == "mlp_act" and not kept else 0)
        built = eye * (adapter + cast_eye) + low + wide * products + inputs  # inside get_lora_weight
        cast = eye * eye_held + low + wide * (products + adapter) + inputs if products != adapter else 0
        held = eye * eye_held + low + wide * adapter + (wide * adapter if quantized or weight != adapter else 0)
        added = held + 2 * wide * adapter + inputs  # scaling * lora_weight, then the sum
        # the output's products: counted on the block's last adapted linear only, since what an earlier one makes
        # sits beside less than the block's end (the layers after it have saved nothing yet); with dropout DoRA
        # recomputes the base product on the dropped input, beside the base layer's own result
        products_out = 3 * tokens * fan_out * adapter + (tokens * fan_out * cb if ad.dropout else 0)
        output = held + products_out + inputs if index == last else 0
        worst = max(worst, built, cast, added, output)
    return worst


def encoder_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """GPT-2 / BERT block: two LayerNorms, fused-QKV MHA with biases, GELU MLP, two dropouts."""
    h, I = shape.hidden_size, shape.intermediate_size
    cb = dt.compute
    # LayerNorm saves its input (mean/rstd are tiny); the next linear saves the output, or under
    # autocast its bf16 cast (CUDA runs layer_norm in fp32, so the fp32 output itself is not saved).
    layer_norms = 2 * (dt.residual * h + cb * h)
    attn = _encoder_attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
    # The merged heads, made contiguous for the output projection. GPT-2 and BERT under SDPA: CUDA's flash and
    # memory-efficient kernels allocate their output (b, s, heads, d) and return it transposed, so
    # transformers' ``transpose(1, 2).contiguous()`` and GPT-2's ``reshape`` are views, and c_proj saves
    # the SDPA output counted above (as the Llama count: ``attention_per_token``). Read on the simulated
    # step (sweep 720464dad0a9: 384-wide GPT-2, fp32, s 8192, checkpointed): +4.0% with a second copy; BERT's SDPA
    # run on an H200 (benchmarks/results/gpu_stacks.md): +1.8% with it.
    o_in = 0 if not eager else cb * h
    # BERT's query, key and value are three linears: under autocast each casts the LayerNorm's fp32 output itself
    # (autocast caches only casts of weights, aten/src/ATen/autocast_mode.cpp cached_cast) and saves its own copy for
    # its weight's gradient, two beyond the one ``layer_norms`` counts
    qkv_casts = 2 * cb * h if dt.input_casts and shape.family == "bert" else 0
    dropout_masks = _residual_dropout_masks_per_token(shape)
    if shape.family == "gpt2" and not shape.one_op_mlp_act:
        # gelu_new, Python ops: pow saves its input (cast to fp32 under CUDA autocast), tanh saves its
        # fp32 output, (1 + tanh) and 0.5 * x are saved by the final mul, whose output fc2 casts.
        wide = FP32 if dt.input_casts else cb
        mlp = 3 * wide * I + 2 * cb * I
    else:
        mlp = 2 * cb * I  # F.gelu (BERT; GPT-2 with activation_function 'gelu') saves its input; fc2 the output
    return layer_norms + attn + o_in + qkv_casts + dropout_masks + mlp


def _encoder_attention_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """What a GPT-2 / BERT block's attention saves a token, full fine-tune or frozen alike (the input gradient reads
    the same tensors). Eager: QK^T saves q and k, AV the dropped-out probabilities and v (q, k, v: views of the 3h
    buffer); softmax saves its output, in fp32 only under autocast (HF's GPT-2/BERT eager attention does not upcast);
    dropout its bool mask. Without autocast this is Korthikanti et al.'s 5as^2b. SDPA: q, k, v (views of the fused
    c_attn output, one 3h buffer), its output and the fp32 lse."""
    h, heads, cb = shape.hidden_size, shape.num_attention_heads, dt.compute
    if eager:
        softmax = FP32 if dt.input_casts else cb
        return cb * 3 * h + (softmax + BOOL + cb) * heads * seq_len
    return cb * 3 * h + FP32 * heads + cb * h


def _residual_dropout_masks_per_token(shape: ActivationShape) -> int:
    """The attention-output and MLP-output dropouts' bool masks (native_dropout); none at p = 0 (GPT-2's resid_pdrop 0:
    the sweep's 720464dad0a9, read on the simulated step, which runs CUDA's dropout: 2h bytes a token less)."""
    return 0 if shape.no_residual_dropout else 2 * BOOL * shape.hidden_size


def frozen_encoder_layer_per_token(shape: ActivationShape, dt: Dtypes, adapters: Adapters, *, seq_len: int,
                                   eager: bool) -> int:
    """A frozen BERT block with LoRA on its query, key or value (the linears ``advisor.model.lora.block_linears``
    lists for it): what ``encoder_layer_per_token`` counts, less what only a trained weight's gradient reads. A frozen
    linear saves its weight alone (the input gradient's), so the LayerNorm outputs the key and the intermediate dense
    read, the attention output dense's input and the GELU output the output dense reads go unsaved. Each adapter's
    lora_A saves its input: under autocast its own cast of the LayerNorm's fp32 output (autocast caches only weights'
    casts), without autocast the block's input itself, once for all; with dropout its own dropped-out input and bool
    mask; lora_B saves ``x A`` (r wide). Read on saved-tensor hooks of transformers' BertLayer with PEFT's default
    query and value adapters under CPU autocast and checked against the simulated step (tests/estimate/
    test_encoder_heads.py)."""
    h, cb = shape.hidden_size, dt.compute
    adapted = len(adapters.inputs)
    layer_norm_inputs = 2 * dt.residual * h  # their backward reads the input (the block's gradient flows through)
    attn = _encoder_attention_per_token(shape, dt, seq_len=seq_len, eager=eager)
    dropout_masks = _residual_dropout_masks_per_token(shape)
    gelu_input = cb * shape.intermediate_size
    if adapters.dropout:
        adapter_inputs = adapted * (cb + BOOL) * h
    else:
        adapter_inputs = (adapted if dt.input_casts else min(adapted, 1)) * cb * h
    return layer_norm_inputs + attn + dropout_masks + gelu_input + adapter_inputs + adapted * cb * adapters.rank


def neox_layer_per_token(shape: ActivationShape, dt: Dtypes, *, seq_len: int, eager: bool) -> int:
    """GPT-NeoX block (parallel residual, partial rotary), read from transformers' modeling_gpt_neox:
    both LayerNorms read the same residual input (saved once); the fused QKV output is kept whole
    (v is a view of it) besides the rotated q and k; SDPA output, lse and the dense input; F.gelu MLP.
    Without the parallel residual (``use_parallel_residual`` false) the second LayerNorm reads the attention
    output plus the residual, a residual-dtype tensor of its own: measured with saved_tensors_hooks on a
    384-wide layer, 1,536 bytes a token more in fp32 (fp32 input under bf16 autocast too) and 768 in bf16."""
    h, I, heads = shape.hidden_size, shape.intermediate_size, shape.num_attention_heads
    cb = dt.compute
    norms = dt.residual * h + 2 * cb * h  # shared input; each LayerNorm's output (or its cast)
    norms += dt.residual * h if shape.sequential_residual else 0
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


def block_input_in_layer_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """The block's own input where the block's count holds it as a saved tensor: the first LayerNorm's
    input (GPT-2, BERT, GPT-NeoX), or the first RMSNorm's ``x.to(float32)``, which is ``x`` itself when
    the residual stream is fp32. Under checkpointing it is the block input checkpointing keeps, not a
    tensor the recomputation makes again (measured on the simulated step: a 384-wide fp32 GPT-NeoX block
    under selective checkpointing recomputes 24,592 bytes a token where its count less the kept attention
    output gave 26,112: its 1,536-byte input and 16 of LayerNorm statistics)."""
    if shape.family in ("gpt2", "bert", "gpt_neox"):
        return dt.residual * shape.hidden_size
    return FP32 * shape.hidden_size if dt.residual == FP32 and shape.family in ("decoder", "mamba") else 0


def embedding_dropout_per_token(shape: ActivationShape) -> int:
    """The embeddings' dropout mask (GPT-2, BERT: bool), kept by whichever rank runs the embedding."""
    if shape.no_embedding_dropout:  # GPT-2 with embd_pdrop 0: dropout returns its input
        return 0
    return BOOL * shape.hidden_size if shape.family in ("gpt2", "bert") else 0


def outside_to_embedding_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """What a token keeps outside the blocks until the embedding's backward: the rotary cos/sin tables
    every block reads (Llama-like decoders but Jamba, GPT-NeoX) and the embeddings' dropout mask (GPT-2,
    BERT). The rest of ``outside_norm_per_token`` (the final norm's tensors, the head's input) is freed
    when the final norm's backward has run, before any block's backward."""
    if shape.family in ("decoder", "gpt_neox"):
        return rope_tables_per_token(shape, dt)
    return embedding_dropout_per_token(shape)


def rope_tables_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    """The rotary cos/sin tables every block reads (residual dtype), a token of one sample: Llama-like decoders but
    Jamba, and GPT-NeoX. transformers builds them from ``position_ids``, which the model makes as
    ``cache_position.unsqueeze(0)`` when the loop passes none (modeling_llama.py ``LlamaModel.forward``): one
    (1, s, head_dim) pair a micro-batch, shared by its samples, so ``estimate_activations`` counts them once a
    sequence (read on the simulated step, sweep b86536f72b68: 2 x 65,536 bytes at micro-batch 8, s 256, head_dim 64)."""
    if (shape.family == "decoder" and shape.hybrid is None) or shape.family == "gpt_neox":
        return 2 * dt.residual * shape.head_dim
    return 0


def outside_norm_per_token(shape: ActivationShape, dt: Dtypes) -> int:
    h = shape.hidden_size
    to_embedding = outside_to_embedding_per_token(shape, dt)
    if shape.family in ("mamba", "decoder"):
        # RMSNorm + head input cast; RoPE cos/sin (residual dtype) are shared by every block (Jamba and
        # Mamba have none).
        norm = rms_norm_per_token(h, dt) + (fp32_norm_scale_per_token(shape, dt) if shape.family == "decoder" else 0)
        return norm + (dt.compute * h if dt.input_casts else 0) + to_embedding
    # Final LayerNorm saves its input; the head saves its output (or its cast); GPT-2 and BERT
    # drop out the embeddings (bool mask); GPT-NeoX's rotary cos/sin are shared by every block.
    return dt.residual * h + dt.compute * h + to_embedding


def selective_kept_per_token(shape: ActivationShape, dt: Dtypes, kept_width: int) -> int:
    """Bytes a token keeps in one block under selective checkpointing beyond the block input: the
    attention kernel's output and fp32 log-sum-exp, and the outputs (``kept_width`` features) of the
    matrix products the policy keeps (``advisor.model.selective.selective_kept``)."""
    q = shape.num_attention_heads * shape.head_dim
    return dt.compute * (q + kept_width) + FP32 * shape.num_attention_heads
