"""LoRA on a frozen T5 / BART: what each block and the outside keep (``frozen_encdec_parts``), and the terms
the checkpointed count (``activations_encdec_recompute``) reuses. Split from ``activations_encdec`` (the full
fine-tune count), which composes it.

A frozen linear saves no input (its weight gradient is not asked for; the input gradient needs only the
weight), a frozen T5LayerNorm's ``weight * x`` saves nothing, a frozen embedding no indices (the token ids and
T5's relative position buckets go): what stays is what the input gradients need, and each adapter's own
tensors. An adapted linear's source, as ``advisor.model.lora.adapter_inputs`` names it (``stack:module.leaf``),
says what its adapter reads: a norm's output (T5 q, k, v, wi; BART's block input or LayerNorm output), the
merged heads (o, out_proj), the feed-forward's activation (wo, fc2), or, in cross-attention, k and v, the
encoder's output: one copy per decoder layer over the source tokens.

Pure functions, integer bytes.
"""

from __future__ import annotations

from typing import Any

from advisor.precision import FP32

BOOL = 1
INT64 = 8


def bias_bytes(shape: Any, dt: Any, length: int, eager: bool) -> int:
    """The per-layer heads x s x s position-bias mask SDPA saves (batch-independent); none in eager."""
    return 0 if eager or shape.encdec.kind == "bart" else dt.compute * shape.num_attention_heads * length * length



_CROSS_KV = ("EncDecAttention.k", "EncDecAttention.v", "encoder_attn.k_proj", "encoder_attn.v_proj")
_INNER = ("o", "out_proj", "wo", "fc2")  # adapters reading an inner tensor (heads, the activation)


def adapter_bytes(dt: Any, ad: Any, inputs: list[tuple[int, str]]) -> int:
    """What the adapters on ``inputs`` save a token: PEFT casts the input to the adapter's dtype
    (``_cast_input_dtype``), then dropout (a bool mask), then ``lora_A`` saves its input (under autocast its own
    low-precision cast of it) and ``lora_B`` its input ``x A``. Without casts or dropout the adapters of one
    source share the tensor they read, which nothing of the frozen base saves: counted once."""
    cb = dt.compute
    total = sum((dt.adapter or cb) * ad.rank + (BOOL * fan_in if ad.dropout else 0) for fan_in, _ in inputs)
    if dt.adapter is not None:  # fp32 adapters without autocast: each saves its own fp32 input (or dropout output)
        return total + sum(dt.adapter * fan_in for fan_in, _ in inputs)
    if dt.input_casts:
        return total + sum(cb * fan_in for fan_in, _ in inputs)

    def width(source: str) -> int:
        return cb if source.split(".")[-1] in _INNER else dt.residual

    if ad.dropout:
        return total + sum(width(source) * fan_in for fan_in, source in inputs)
    shared = {(source.split(":")[1].split(".")[0], source.split(".")[-1] in _INNER): (fan_in, source)
              for fan_in, source in inputs}
    return total + sum(width(source) * fan_in for fan_in, source in shared.values())


def adapter_weight_casts(shape: Any, dt: Any, ad: Any, inputs: list[tuple[int, str]]) -> int:
    """Autocast's low-precision copies of the fp32 adapters' weights, ``A`` and ``B``, saved by their matmuls:
    a block's, whatever the tokens (none without autocast)."""
    if not dt.input_casts:
        return 0
    wide = {"o": shape.hidden_size, "out_proj": shape.hidden_size, "wo": shape.hidden_size, "fc2": shape.hidden_size,
            "wi": shape.intermediate_size, "wi_0": shape.intermediate_size, "wi_1": shape.intermediate_size,
            "fc1": shape.intermediate_size}
    heads = shape.num_attention_heads * shape.head_dim
    return sum(dt.compute * ad.rank * (fan_in + wide.get(source.split(".")[-1], heads)) for fan_in, source in inputs)


def bart_residual(dt: Any) -> int:
    """BART's residual stream: autocast runs ``layer_norm`` in fp32 (CUDA's fp32 list), so over a bf16 base every
    LayerNorm's input and output, hence the residual and the encoder's output, are fp32 (T5's norm is Python ops
    that end in the weight's dtype: its residual stays in the base's)."""
    return FP32 if dt.input_casts else dt.residual


def t5_softmax_bytes(dt: Any) -> int:
    """Width of T5's eager softmax output (``eager_attention_forward`` calls ``softmax`` on the scores as they are):
    fp32 under CUDA autocast (softmax is on its fp32 list), else the compute dtype (FSDP2's MixedPrecisionPolicy,
    a module cast whole). Read on the simulated step (tiny T5 LoRA q,v, eager, s 128: under FSDP2 each attention
    saves 1,024 bytes a token less than under DDP's autocast, heads x s x (4 - 2))."""
    return FP32 if dt.input_casts else dt.compute


def frozen_t5_norm(h: int, dt: Any) -> int:
    """A frozen T5LayerNorm: the fp32 copy of its input (pow) and, when that is not fp32, the input (the mul by
    rsqrt saves both factors)."""
    return FP32 * h + (dt.residual * h if dt.residual != FP32 else 0)


def _frozen_attention(shape: Any, dt: Any, *, kv_len: int, eager: bool, cross: bool) -> int:
    """One frozen attention sublayer, a query token, without its norm (T5) or LayerNorm (BART): q (k, v) and the
    kernel's tensors as in the full count; o saves no input, so the merged heads are not kept."""
    n, heads, cb = shape.num_attention_heads * shape.head_dim, shape.num_attention_heads, dt.compute
    qkv = cb * n * (1 if cross else 3)
    if eager and shape.encdec.kind == "t5":  # the softmax output, its dropout mask, the dropped probabilities
        core = (t5_softmax_bytes(dt) + BOOL + cb) * heads * kv_len
    elif eager:  # BART: fp32 softmax under autocast, then the AV matmul's cast
        core = ((FP32 + cb) if dt.input_casts else cb) * heads * kv_len
    else:
        core = cb * n + FP32 * heads  # output and log-sum-exp
    post = bart_residual(dt) * shape.hidden_size if shape.encdec.kind == "bart" else 0  # the LayerNorm's input
    return qkv + core + BOOL * shape.hidden_size + post


def _frozen_feed_forward(shape: Any, dt: Any) -> int:
    """relu (T5) saves its output, then the dropout mask; BART's GELU its input (fc1's output), the optional
    activation dropout's mask, the output dropout's mask and the LayerNorm's input."""
    h, F, cb = shape.hidden_size, shape.intermediate_size, dt.compute
    if shape.encdec.kind == "bart":
        return cb * F + (BOOL * F if shape.encdec.activation_dropout else 0) + BOOL * h + bart_residual(dt) * h
    return frozen_t5_activation(shape, dt) + BOOL * F + BOOL * h


def frozen_t5_activation(shape: Any, dt: Any) -> int:
    """A frozen T5 feed-forward's activation, a token: relu saves its output; the gated one (T5 v1.1, flan-t5:
    ``gelu_new(wi_0(x)) * wi_1(x)``) saves gelu_new's tensors, pow's input upcast, tanh's output and ``1 + tanh``
    in the widened dtype (CUDA autocast runs pow in fp32), ``0.5 * x`` in the compute dtype, then both factors of the
    product: gelu_new's output, widened (``0.5 * x * (1 + tanh)`` promotes), and wi_1's output. The linears, frozen,
    save nothing. Read on the simulated step (tiny gated T5, bf16 base under autocast: per layer and token 4 fp32
    and 2 bf16 tensors of d_ff, and the dropout's mask)."""
    F, cb = shape.intermediate_size, dt.compute
    if not shape.encdec.gated:
        return cb * F
    wide = FP32 if dt.input_casts else cb
    return (3 * wide + cb) * F + (wide + cb) * F


def _first_block_unsaved(shape: Any, dt: Any, inputs: list[tuple[int, str]], *, kv_len: int, eager: bool) -> int:
    """What a T5 stack's first block does not save, a token: its input (the frozen embedding's output) needs no
    gradient, so its attention norm saves nothing, and q and k are saved only for each other's gradient (the scores'
    matmul saves k when q needs a gradient, q when k does); with neither adapted, the softmax's tensors go too.
    BART's first block loses nothing here: its SDPA kernel saves q, k, v, the output and log-sum-exp when any of
    them needs a gradient, and no norm reads the block's input. Read on the simulated step (T5, 128 wide, q,v:
    the first blocks' backward frees 1,044 and 916 bytes a token less than the others')."""
    if shape.encdec.kind != "t5":
        return 0
    adapted = {source.split(".")[-1] for _, source in inputs if source.split(":")[1].startswith("SelfAttention.")}
    n, cb = shape.num_attention_heads * shape.head_dim, dt.compute
    unsaved = frozen_t5_norm(shape.hidden_size, dt)
    if not eager or not adapted & {"q", "k", "v"}:
        return unsaved
    unsaved += (cb * n if "k" not in adapted else 0) + (cb * n if "q" not in adapted else 0)
    if not adapted & {"q", "k"}:  # the scores need no gradient: softmax output, mask and v go
        unsaved += (t5_softmax_bytes(dt) + BOOL) * shape.num_attention_heads * kv_len + cb * n
    return unsaved


def frozen_encdec_parts(shape: Any, dt: Any, ad: Any, *, micro_batch_size: int, src_len: int, tgt_len: int,
                        eager: bool, checkpointing: bool) -> tuple[int, int, int]:
    """(an encoder block, a decoder block, outside the blocks) of a frozen T5 / BART with LoRA adapters, bytes a
    micro-batch (the module's section above; ``bias_bytes`` as in the full count, SDPA's per-layer mask)."""
    h, b, t5 = shape.hidden_size, micro_batch_size, shape.encdec.kind == "t5"
    src, tgt = b * src_len, b * tgt_len
    norm = frozen_t5_norm(h, dt) if t5 else 0
    enc_in = [i for i in ad.inputs if i[1].startswith("encoder:")]
    dec_in = [i for i in ad.inputs if i[1].startswith("decoder:") and i[1].split(":")[1] not in _CROSS_KV]
    cross_kv = [i for i in ad.inputs if i[1].startswith("decoder:") and i[1].split(":")[1] in _CROSS_KV]
    enc = src * (2 * norm + _frozen_attention(shape, dt, kv_len=src_len, eager=eager, cross=False)
                 + _frozen_feed_forward(shape, dt) + adapter_bytes(dt, ad, enc_in))
    enc += bias_bytes(shape, dt, src_len, eager) + adapter_weight_casts(shape, dt, ad, enc_in)
    n = shape.num_attention_heads * shape.head_dim
    dec = tgt * (3 * norm + _frozen_attention(shape, dt, kv_len=tgt_len, eager=eager, cross=False)
                 + _frozen_attention(shape, dt, kv_len=src_len, eager=eager, cross=True)
                 + _frozen_feed_forward(shape, dt) + adapter_bytes(dt, ad, dec_in))
    dec += src * (2 * dt.compute * n + adapter_bytes(dt, ad, cross_kv)) + bias_bytes(shape, dt, tgt_len, eager)
    dec += adapter_weight_casts(shape, dt, ad, dec_in + cross_kv)
    # Outside: the labels, each stack's final norm (T5) and dropout mask; the encoder's output, which the
    # decoder's blocks read (kept by their checkpoints, or by the model's output).
    final = norm + (BOOL * h if t5 else 0)
    outside = tgt * (INT64 + final) + src * (final + (dt.residual if t5 else bart_residual(dt)) * h)
    if not eager and t5:  # cross-attention's zero bias, made once and shared by the decoder's layers
        outside += dt.compute * shape.num_attention_heads * tgt_len * src_len
    # The first block of each stack reads the frozen embedding's output (no gradient): less saved there.
    outside -= src * _first_block_unsaved(shape, dt, enc_in, kv_len=src_len, eager=eager) if not checkpointing else 0
    outside -= tgt * _first_block_unsaved(shape, dt, dec_in, kv_len=tgt_len, eager=eager) if not checkpointing else 0
    return enc, dec, outside
