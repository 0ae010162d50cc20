"""Activation memory of an encoder-decoder model (T5), per micro-batch: the encoder's blocks over
the source length, the decoder's blocks (self-attention, cross-attention over the encoder output,
feed-forward) over the target length, the embeddings, final norms, head and loss.

Read from transformers 5.23's ``modeling_t5.py`` and listed with
``torch.autograd.graph.saved_tensors_hooks`` on tiny T5 configs (relu and gated-gelu; fp32 and bf16;
eager and SDPA); checked in ``tests/estimate/test_encdec_activations.py`` and against the simulated
step (``benchmarks/model_kinds.py``). What each term is (saved tensors per aten's derivatives.yaml):

- T5LayerNorm (``x * rsqrt(mean(x.float()^2))``, then ``weight * x.to(weight dtype)``): the fp32 copy
  of the input (pow), the input itself when it is not fp32 (the mul by rsqrt saves both factors), the
  normalised tensor in the residual dtype (the weight's mul) and the output, saved by the next linear
  unless autocast casts it (the casts are counted at each linear).
- Attention. Eager (``eager_attention_forward``): q, k, v; the softmax output (fp32 under CUDA
  autocast), the dropout mask (bool: CUDA's fused dropout) and the dropped probabilities; the merged
  heads made contiguous for ``o``; no 1/sqrt(d) scaling and the position bias is added (neither
  saves anything). SDPA: the position bias is the float ``attn_mask`` and it needs a gradient, so a
  GPU runs the memory-efficient kernel (flash takes no mask), which saves q, k, v, the output, an
  fp32 log-sum-exp per head and the mask; ``create_position_bias_mask`` makes the mask contiguous
  (encoder: a copy of the permuted bias) or masks it causally (decoder: ``torch.where``), one
  heads x s x s tensor per layer. Its backward writes the bias gradient at the batch's full
  (b, heads, s, s) shape before reducing it (a transient). Not measured on a GPU here: the CPU
  simulator sends SDPA with a mask that needs a gradient and dropout to the math kernel, which on the
  CPU upcasts bf16 to fp32 and saves s^2 scores; the plan says so.
- Cross-attention: q over the target, k and v over the source in every decoder layer; the encoder
  output they read is saved once (its cast per linear under autocast).
- Feed-forward: relu saves its output, then the dropout mask and wo's input; gated-gelu adds
  ``gelu_new``'s Python ops (tanh form: three tensors in the widened dtype, one in the compute dtype,
  as GPT-2's), the gate's output and wi_1's output (saved by the product).
- Outside the blocks: token ids (embedding backward) of both stacks, the labels, the relative
  position buckets (int64, s^2 and t^2 per micro-batch), the embedding and final dropout masks, the
  final norms, the head's input. BART adds ``final_logits_bias``, a buffer that FSDP2 and autocast
  leave in fp32, so its logits are fp32 unless the whole module was cast. The loss is ``CrossEntropyLoss`` on the logits as they come
  (log-softmax output in the compute dtype; under autocast CUDA runs it in fp32 on an fp32 copy).

BART (``modeling_bart.py``; LayerNorm after each residual add, learned positions, biases, GELU, no
position bias: SDPA runs flash on a GPU as on the CPU): each block saves its input (read by q, k, v),
q, k, v, the attention output and log-sum-exp (eager: the probabilities and the merged heads), the
output dropout's mask, each LayerNorm's input (its fp32 mean / rstd, 4 bytes a token, left out as
for BERT), the feed-forward's input (the first LayerNorm's output), fc1's output (saved by GELU),
GELU's output (saved by fc2; with activation dropout its mask and the dropped copy instead), fc2's
dropout mask; a block's last LayerNorm output is the next block's input.

LoRA on a frozen base (PEFT's adapters; ``frozen_encdec_parts``, relu and gated T5 and BART, LoRA not DoRA): what the input
gradients need and each adapter's tensors, the stacks' first blocks less (their input is the frozen embedding's),
BART's residual in fp32 under autocast. Checked against the simulated step in ``tests/estimate/test_encdec_lora.py``
without checkpointing (within 2%). Under checkpointing the recomputed block's forward locals are not counted: on
128-wide configs at s 128, q,v within 2.5% (T5 eager -2.3%, BART +0.8%), all-linear about -5% (not in the tests).
Pure functions, integer bytes.
"""

from __future__ import annotations

from typing import Any

from advisor.estimate.activations_encdec_recompute import recompute_peak_bytes
from advisor.precision import FP32

BOOL = 1
INT64 = 8

BART_NOTE = ("encoder-decoder (BART): encoder blocks over --seq-len, decoder blocks (self-attention, cross-attention, "
             "feed-forward) over --target-len; attention dropout is taken as 0 (a GPU's SDPA kernels keep no mask "
             "for it; eager attention with attention dropout would add a mask and a copy per score)")
ENCDEC_DORA_REFUSED = ("DoRA on an encoder-decoder (T5, BART) is not modelled: PEFT's DoRA adds per adapted linear "
                       "a weight-sized product lora_B @ lora_A, its norm and the magnitude's rescaled output, which "
                       "the T5/BART activation count does not hold; plan it as LoRA (drop --dora)")
ENCDEC_NOTE = ("encoder-decoder (T5): encoder blocks over --seq-len, decoder blocks (self-attention, cross-attention, "
               "feed-forward) over --target-len, T5's relative position bias; SDPA is counted as a GPU runs it with "
               "a mask that needs a gradient (memory-efficient kernel: q, k, v, output, log-sum-exp, a heads x s x s "
               "bias per layer), not measured on a GPU; the CPU simulator runs the math kernel there, so only "
               "--attention eager is checked against it")


def _norm(h: int, dt: Any) -> int:
    """T5LayerNorm's saved bytes per token (module docstring), its output included unless autocast casts."""
    low_input = dt.residual * h if dt.residual != FP32 else 0
    return FP32 * h + low_input + dt.residual * h + (0 if dt.input_casts else dt.residual * h)


def _attention(shape: Any, dt: Any, *, kv_len: int, eager: bool, cross: bool) -> int:
    """Saved bytes per query token of one attention sublayer (norm excluded). ``cross``: k and v are
    counted by the caller (they cover the source tokens)."""
    n, heads, cb = shape.num_attention_heads * shape.head_dim, shape.num_attention_heads, dt.compute
    casts = (1 if cross else 3) * cb * shape.hidden_size if dt.input_casts else 0  # q (and k, v) cast their input
    qkv = cb * n * (1 if cross else 3)
    if eager:
        softmax = FP32 if dt.input_casts else cb
        core = (softmax + BOOL + cb) * heads * kv_len + cb * n  # + the contiguous merged heads
    else:
        core = cb * n + FP32 * heads  # output (o's input is a view of it) and log-sum-exp
    return casts + qkv + core + BOOL * shape.hidden_size  # + the output dropout's mask


def _feed_forward(shape: Any, dt: Any) -> int:
    F, cb, facts = shape.intermediate_size, dt.compute, shape.encdec
    casts = cb * shape.hidden_size * (2 if facts.gated else 1) if dt.input_casts else 0
    wo_in = cb * F  # the dropped activation (already in the compute dtype)
    if not facts.gated:
        act = cb * F  # relu (and any single-input activation) saves its output
    else:
        wide = FP32 if dt.input_casts else cb
        act = (3 * wide + cb) * F + 2 * cb * F  # gelu_new's ops, then the gate and wi_1 outputs (the product)
    return casts + act + BOOL * F + wo_in + BOOL * shape.hidden_size


def encoder_layer_per_token(shape: Any, dt: Any, *, src_len: int, eager: bool) -> int:
    """Bytes one source token leaves saved in one T5 encoder block."""
    h = shape.hidden_size
    return 2 * _norm(h, dt) + _attention(shape, dt, kv_len=src_len, eager=eager, cross=False) + _feed_forward(shape, dt)


def decoder_layer_per_token(shape: Any, dt: Any, *, tgt_len: int, src_len: int, eager: bool) -> int:
    """Bytes one target token leaves saved in one T5 decoder block (cross-attention's k and v, which
    cover the source tokens, excluded: ``cross_kv_bytes``)."""
    h = shape.hidden_size
    return (3 * _norm(h, dt) + _attention(shape, dt, kv_len=tgt_len, eager=eager, cross=False)
            + _attention(shape, dt, kv_len=src_len, eager=eager, cross=True) + _feed_forward(shape, dt))


def _bart_attention(shape: Any, dt: Any, *, kv_len: int, eager: bool, cross: bool) -> int:
    """BART attention sublayer, per query token: its input (or autocast's casts), q (k, v), the
    kernel's saved tensors, the output dropout's mask and the following LayerNorm's input."""
    h, n, heads, cb = shape.hidden_size, shape.num_attention_heads * shape.head_dim, shape.num_attention_heads, dt.compute
    projections = 1 if cross else 3
    inputs = projections * cb * h if dt.input_casts else dt.residual * h
    if eager:  # probabilities (fp32 softmax under CUDA autocast, then the AV matmul's cast) + merged heads
        core = ((FP32 + cb) if dt.input_casts else cb) * heads * kv_len + cb * n
    else:
        core = cb * n + FP32 * heads
    return inputs + projections * cb * n + core + BOOL * h + dt.residual * h


def _bart_feed_forward(shape: Any, dt: Any) -> int:
    h, F, cb = shape.hidden_size, shape.intermediate_size, dt.compute
    inputs = cb * h if dt.input_casts else dt.residual * h
    act_dropout = BOOL * F if shape.encdec.activation_dropout else 0
    return inputs + 2 * cb * F + act_dropout + BOOL * h + dt.residual * h


def _encoder_layer(shape: Any, dt: Any, *, src_len: int, eager: bool) -> int:
    if shape.encdec.kind == "bart":
        return _bart_attention(shape, dt, kv_len=src_len, eager=eager, cross=False) + _bart_feed_forward(shape, dt)
    return encoder_layer_per_token(shape, dt, src_len=src_len, eager=eager)


def _decoder_layer(shape: Any, dt: Any, *, tgt_len: int, src_len: int, eager: bool) -> int:
    if shape.encdec.kind == "bart":
        return (_bart_attention(shape, dt, kv_len=tgt_len, eager=eager, cross=False)
                + _bart_attention(shape, dt, kv_len=src_len, eager=eager, cross=True) + _bart_feed_forward(shape, dt))
    return decoder_layer_per_token(shape, dt, tgt_len=tgt_len, src_len=src_len, eager=eager)


def _outside(shape: Any, dt: Any, *, src: int, tgt: int, src_len: int, tgt_len: int, eager: bool) -> int:
    """Embeddings, final norms, the encoder output the cross-attentions read, the head's input, labels."""
    h, cb, n_dec = shape.hidden_size, dt.compute, shape.encdec.num_decoder_layers
    encoder_out = dt.residual * h + (2 * n_dec * cb * h if dt.input_casts else 0)  # read by every cross k and v
    head_in = cb * h if dt.input_casts else dt.residual * h
    if shape.encdec.kind == "bart":  # ids; the embedding LayerNorm's input and the dropout mask after it
        return src * (INT64 + dt.residual * h + BOOL * h + encoder_out) + tgt * (2 * INT64 + dt.residual * h
                                                                               + BOOL * h + head_in)
    final_norm = FP32 * h + (dt.residual * h if dt.residual != FP32 else 0) + dt.residual * h
    outside = (src * (INT64 + 2 * BOOL * h + final_norm + encoder_out)
               + tgt * (2 * INT64 + 2 * BOOL * h + final_norm + head_in)
               + INT64 * (src_len * src_len + tgt_len * tgt_len))  # relative position buckets
    if not eager:  # cross-attention's zero bias, made once and shared by the decoder's layers
        outside += cb * shape.num_attention_heads * tgt_len * src_len
    return outside


def _bias_bytes(shape: Any, dt: Any, length: int, eager: bool) -> int:
    """The per-layer heads x s x s position-bias mask SDPA saves (batch-independent); none in eager."""
    return 0 if eager or shape.encdec.kind == "bart" else dt.compute * shape.num_attention_heads * length * length


def estimate_encdec_activations(shape: Any, dt: Any, *, micro_batch_size: int, src_len: int, tgt_len: int,
                                checkpointing: bool, eager: bool, adapters: Any = None) -> dict[str, int]:
    """The fields of ``ActivationEstimate`` for a T5 or BART model (the caller builds it); ``adapters``:
    LoRA on a frozen base (``activations_encdec_frozen``)."""
    facts, b, h, V = shape.encdec, micro_batch_size, shape.hidden_size, shape.vocab_size
    cb, n_enc, n_dec = dt.compute, facts.num_encoder_layers, facts.num_decoder_layers
    src, tgt = b * src_len, b * tgt_len
    n = shape.num_attention_heads * shape.head_dim
    if adapters is not None:
        enc, dec, outside = frozen_encdec_parts(shape, dt, adapters, micro_batch_size=b, src_len=src_len,
                                                tgt_len=tgt_len, eager=eager, checkpointing=checkpointing)
    else:
        enc = src * _encoder_layer(shape, dt, src_len=src_len, eager=eager) + _bias_bytes(shape, dt, src_len, eager)
        dec = (tgt * _decoder_layer(shape, dt, tgt_len=tgt_len, src_len=src_len, eager=eager)
               + src * 2 * cb * n + _bias_bytes(shape, dt, tgt_len, eager))
        outside = _outside(shape, dt, src=src, tgt=tgt, src_len=src_len, tgt_len=tgt_len, eager=eager)
    layer = max(enc, dec)
    freed = recompute_end = mlp_freed = 0
    if checkpointing:  # each block keeps its input (T5Block is a GradientCheckpointingLayer)
        kept = _bart_residual(dt) if adapters is not None and facts.kind == "bart" else dt.residual
        saved = kept * h * (n_enc * src + n_dec * tgt) + outside
        if adapters is not None:
            extra, freed, (enc_peak, dec_peak), mlp_freed = _frozen_checkpointed(
                shape, dt, adapters, micro_batch_size=b, src_len=src_len, tgt_len=tgt_len, eager=eager,
                top_stack="decoder" if dec >= enc else "encoder")
            saved += extra
            # The encoder's blocks run their backward after the decoder's: by then only their own inputs, their
            # stack's position bias (T5) and the labels are kept; the rest of what the decoder read is gone.
            at_encoder = kept * h * n_enc * src + tgt * INT64 + (
                dt.residual * shape.num_attention_heads * src_len * src_len if facts.kind == "t5" else 0)
            recompute_end = max(0, dec_peak - layer, enc_peak - layer - (saved - freed - at_encoder))
    else:
        saved = n_enc * enc + n_dec * dec + outside
    # CrossEntropyLoss on the logits as they are: under autocast CUDA runs it in fp32 on an fp32 copy.
    # BART adds final_logits_bias (a buffer): fp32 logits unless the engine cast the whole module,
    # the head's own output a transient of the add.
    fp32_logits = facts.kind == "bart" and dt.buffer == FP32
    loss_b = FP32 if dt.input_casts or fp32_logits else cb
    logits = tgt * V * (cb + (FP32 if dt.input_casts or fp32_logits else 0) + loss_b)
    loss = tgt * V * 3 * loss_b
    tokens = max(src, tgt)
    residual = _bart_residual(dt) if adapters is not None and facts.kind == "bart" else dt.residual  # its gradients
    backward_temp = tokens * (2 * residual * h + 2 * cb * shape.intermediate_size)
    if not eager and facts.kind == "t5" and adapters is None:  # the memory-efficient kernel's bias gradient at the batch's full shape
        backward_temp += cb * b * shape.num_attention_heads * max(src_len, tgt_len) ** 2
    return dict(saved_bytes=saved, logits_bytes=logits, loss_transient_bytes=loss, layer_bytes=layer,
                recompute_bytes=layer if checkpointing else 0, backward_temp_bytes=backward_temp,
                returned_logits_bytes=tgt * V * cb, outside_freed_bytes=freed, recompute_end_bytes=recompute_end,
                mlp_freed_bytes=mlp_freed)


def _frozen_checkpointed(shape: Any, dt: Any, ad: Any, *, micro_batch_size: int, src_len: int, tgt_len: int,
                         eager: bool, top_stack: str) -> tuple[int, int, tuple[int, int], int]:
    """A checkpointed frozen base: (kept beyond the blocks' inputs and ``frozen_encdec_parts``' outside, the part of
    that outside its blocks' backward finds freed, the recomputation's peaks (encoder, decoder), what the larger block
    (``top_stack``'s) has freed by its feed-forward's gradients: its last dropout's mask, BART's last LayerNorm input
    and the ``wo`` / ``fc2`` adapters' tensors, whose backward runs first). Read op by op on the
    simulated step (T5 eager, BART SDPA, tests/estimate/test_encdec_lora_ckpt.py): every later block's checkpoint
    holds its stack's relative position bias (the frozen embedding's (s, s, heads) output, in the base's dtype), the
    decoder's causal mask ((b, 1, t, t): T5 eager, float in the base's dtype; BART SDPA, bool) and T5's zero cross-
    attention bias ((1, heads, t, s), compute dtype; SDPA's is counted with the outside already). The decoder's
    final norm and dropout mask (T5) go with their backward, before any block's."""
    b, heads, h = micro_batch_size, shape.num_attention_heads, shape.hidden_size
    tgt, t5 = b * tgt_len, shape.encdec.kind == "t5"
    mask = dt.residual * b * tgt_len * tgt_len if eager else BOOL * b * tgt_len * tgt_len
    kept = mask
    if t5:  # (SDPA T5 not measured: the CPU simulator runs the math kernel; its zero bias is in the outside)
        kept += dt.residual * heads * (src_len * src_len + tgt_len * tgt_len)
        kept += dt.compute * heads * tgt_len * src_len if eager else 0
    freed = tgt * (_frozen_t5_norm(h, dt) + BOOL * h) if t5 else 0
    residual = dt.residual if t5 else _bart_residual(dt)
    peaks = recompute_peak_bytes(shape, dt, ad, micro_batch_size=b, src_len=src_len, tgt_len=tgt_len, eager=eager,
                                adapters=_adapter_bytes, weight_casts=_weight_casts, residual=residual)
    last = [i for i in ad.inputs if i[1].startswith(f"{top_stack}:") and i[1].split(".")[-1] in ("wo", "fc2")]
    tokens = b * (tgt_len if top_stack == "decoder" else src_len)
    mlp_freed = tokens * (BOOL * h + (0 if t5 else residual * h) + (_adapter_bytes(dt, ad, last) if last else 0))
    return kept, freed, peaks, mlp_freed


# -- LoRA on a frozen base ---------------------------------------------------------------------------------------
# A frozen linear saves no input (its weight gradient is not asked for; the input gradient needs only the
# weight), a frozen T5LayerNorm's ``weight * x`` saves nothing, a frozen embedding no indices (the token ids and
# T5's relative position buckets go): what stays is what the input gradients need, and each adapter's own
# tensors. An adapted linear's source, as ``advisor.model.lora.adapter_inputs`` names it (``stack:module.leaf``),
# says what its adapter reads: a norm's output (T5 q, k, v, wi; BART's block input or LayerNorm output), the
# merged heads (o, out_proj), the feed-forward's activation (wo, fc2), or, in cross-attention, k and v, the
# encoder's output: one copy per decoder layer over the source tokens.

_CROSS_KV = ("EncDecAttention.k", "EncDecAttention.v", "encoder_attn.k_proj", "encoder_attn.v_proj")
_INNER = ("o", "out_proj", "wo", "fc2")  # adapters reading an inner tensor (heads, the activation)


def _adapter_bytes(dt: Any, ad: Any, inputs: list[tuple[int, str]]) -> int:
    """What the adapters on ``inputs`` save a token: PEFT casts the input to the adapter's dtype
    (``_cast_input_dtype``), then dropout (a bool mask), then ``lora_A`` saves its input (under autocast its own
    low-precision cast of it) and ``lora_B`` its input ``x A``. Without casts or dropout the adapters of one
    source share the tensor they read, which nothing of the frozen base saves: counted once."""
    cb = dt.compute
    total = sum(cb * ad.rank + (BOOL * fan_in if ad.dropout else 0) for fan_in, _ in inputs)
    if dt.input_casts:
        return total + sum(cb * fan_in for fan_in, _ in inputs)

    def width(source: str) -> int:
        return cb if source.split(".")[-1] in _INNER else dt.residual

    if ad.dropout:
        return total + sum(width(source) * fan_in for fan_in, source in inputs)
    shared = {(source.split(":")[1].split(".")[0], source.split(".")[-1] in _INNER): (fan_in, source)
              for fan_in, source in inputs}
    return total + sum(width(source) * fan_in for fan_in, source in shared.values())


def _weight_casts(shape: Any, dt: Any, ad: Any, inputs: list[tuple[int, str]]) -> int:
    """Autocast's low-precision copies of the fp32 adapters' weights, ``A`` and ``B``, saved by their matmuls:
    a block's, whatever the tokens (none without autocast)."""
    if not dt.input_casts:
        return 0
    wide = {"o": shape.hidden_size, "out_proj": shape.hidden_size, "wo": shape.hidden_size, "fc2": shape.hidden_size,
            "wi": shape.intermediate_size, "wi_0": shape.intermediate_size, "wi_1": shape.intermediate_size,
            "fc1": shape.intermediate_size}
    heads = shape.num_attention_heads * shape.head_dim
    return sum(dt.compute * ad.rank * (fan_in + wide.get(source.split(".")[-1], heads)) for fan_in, source in inputs)


def _bart_residual(dt: Any) -> int:
    """BART's residual stream: autocast runs ``layer_norm`` in fp32 (CUDA's fp32 list), so over a bf16 base every
    LayerNorm's input and output, hence the residual and the encoder's output, are fp32 (T5's norm is Python ops
    that end in the weight's dtype: its residual stays in the base's)."""
    return FP32 if dt.input_casts else dt.residual


def _frozen_t5_norm(h: int, dt: Any) -> int:
    """A frozen T5LayerNorm: the fp32 copy of its input (pow) and, when that is not fp32, the input (the mul by
    rsqrt saves both factors)."""
    return FP32 * h + (dt.residual * h if dt.residual != FP32 else 0)


def _frozen_attention(shape: Any, dt: Any, *, kv_len: int, eager: bool, cross: bool) -> int:
    """One frozen attention sublayer, a query token, without its norm (T5) or LayerNorm (BART): q (k, v) and the
    kernel's tensors as in the full count; o saves no input, so the merged heads are not kept."""
    n, heads, cb = shape.num_attention_heads * shape.head_dim, shape.num_attention_heads, dt.compute
    qkv = cb * n * (1 if cross else 3)
    if eager and shape.encdec.kind == "t5":  # softmax in fp32, its dropout mask, the dropped probabilities
        core = (FP32 + BOOL + cb) * heads * kv_len
    elif eager:  # BART: fp32 softmax under autocast, then the AV matmul's cast
        core = ((FP32 + cb) if dt.input_casts else cb) * heads * kv_len
    else:
        core = cb * n + FP32 * heads  # output and log-sum-exp
    post = _bart_residual(dt) * shape.hidden_size if shape.encdec.kind == "bart" else 0  # the LayerNorm's input
    return qkv + core + BOOL * shape.hidden_size + post


def _frozen_feed_forward(shape: Any, dt: Any) -> int:
    """relu (T5) saves its output, then the dropout mask; BART's GELU its input (fc1's output), the optional
    activation dropout's mask, the output dropout's mask and the LayerNorm's input."""
    h, F, cb = shape.hidden_size, shape.intermediate_size, dt.compute
    if shape.encdec.kind == "bart":
        return cb * F + (BOOL * F if shape.encdec.activation_dropout else 0) + BOOL * h + _bart_residual(dt) * h
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
    unsaved = _frozen_t5_norm(shape.hidden_size, dt)
    if not eager or not adapted & {"q", "k", "v"}:
        return unsaved
    unsaved += (cb * n if "k" not in adapted else 0) + (cb * n if "q" not in adapted else 0)
    if not adapted & {"q", "k"}:  # the scores need no gradient: softmax output, mask and v go
        unsaved += (FP32 + BOOL) * shape.num_attention_heads * kv_len + cb * n
    return unsaved


def frozen_encdec_parts(shape: Any, dt: Any, ad: Any, *, micro_batch_size: int, src_len: int, tgt_len: int,
                        eager: bool, checkpointing: bool) -> tuple[int, int, int]:
    """(an encoder block, a decoder block, outside the blocks) of a frozen T5 / BART with LoRA adapters, bytes a
    micro-batch (the module's section above; ``_bias_bytes`` as in the full count, SDPA's per-layer mask)."""
    h, b, t5 = shape.hidden_size, micro_batch_size, shape.encdec.kind == "t5"
    src, tgt = b * src_len, b * tgt_len
    norm = _frozen_t5_norm(h, dt) if t5 else 0
    enc_in = [i for i in ad.inputs if i[1].startswith("encoder:")]
    dec_in = [i for i in ad.inputs if i[1].startswith("decoder:") and i[1].split(":")[1] not in _CROSS_KV]
    cross_kv = [i for i in ad.inputs if i[1].startswith("decoder:") and i[1].split(":")[1] in _CROSS_KV]
    enc = src * (2 * norm + _frozen_attention(shape, dt, kv_len=src_len, eager=eager, cross=False)
                 + _frozen_feed_forward(shape, dt) + _adapter_bytes(dt, ad, enc_in))
    enc += _bias_bytes(shape, dt, src_len, eager) + _weight_casts(shape, dt, ad, enc_in)
    n = shape.num_attention_heads * shape.head_dim
    dec = tgt * (3 * norm + _frozen_attention(shape, dt, kv_len=tgt_len, eager=eager, cross=False)
                 + _frozen_attention(shape, dt, kv_len=src_len, eager=eager, cross=True)
                 + _frozen_feed_forward(shape, dt) + _adapter_bytes(dt, ad, dec_in))
    dec += src * (2 * dt.compute * n + _adapter_bytes(dt, ad, cross_kv)) + _bias_bytes(shape, dt, tgt_len, eager)
    dec += _weight_casts(shape, dt, ad, dec_in + cross_kv)
    # Outside: the labels, each stack's final norm (T5) and dropout mask; the encoder's output, which the
    # decoder's blocks read (kept by their checkpoints, or by the model's output).
    final = norm + (BOOL * h if t5 else 0)
    outside = tgt * (INT64 + final) + src * (final + (dt.residual if t5 else _bart_residual(dt)) * h)
    if not eager and t5:  # cross-attention's zero bias, made once and shared by the decoder's layers
        outside += dt.compute * shape.num_attention_heads * tgt_len * src_len
    # The first block of each stack reads the frozen embedding's output (no gradient): less saved there.
    outside -= src * _first_block_unsaved(shape, dt, enc_in, kv_len=src_len, eager=eager) if not checkpointing else 0
    outside -= tgt * _first_block_unsaved(shape, dt, dec_in, kv_len=tgt_len, eager=eager) if not checkpointing else 0
    return enc, dec, outside
