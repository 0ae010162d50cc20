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

LoRA on a frozen base (PEFT's adapters; relu and gated T5 and BART, LoRA not DoRA, which the planner refuses:
``ENCDEC_DORA_REFUSED``): what a block saves, ``activations_encdec_frozen``; under checkpointing, what is kept
outside the blocks and the recomputation's peak, ``activations_encdec_recompute``. Checked against the simulated
step in ``tests/estimate/test_encdec_lora.py`` (no checkpointing, within 2%) and
``tests/estimate/test_encdec_lora_ckpt.py`` (checkpointing and the gated feed-forward, within 1.5%).
Pure functions, integer bytes.
"""

from __future__ import annotations

from typing import Any

from advisor.estimate.activations_encdec_frozen import BOOL, INT64, bart_residual, bias_bytes, frozen_encdec_parts
from advisor.estimate.activations_encdec_recompute import frozen_checkpointed_parts
from advisor.precision import FP32

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
        enc = src * _encoder_layer(shape, dt, src_len=src_len, eager=eager) + bias_bytes(shape, dt, src_len, eager)
        dec = (tgt * _decoder_layer(shape, dt, tgt_len=tgt_len, src_len=src_len, eager=eager)
               + src * 2 * cb * n + bias_bytes(shape, dt, tgt_len, eager))
        outside = _outside(shape, dt, src=src, tgt=tgt, src_len=src_len, tgt_len=tgt_len, eager=eager)
    layer = max(enc, dec)
    freed = recompute_end = mlp_freed = 0
    if checkpointing:  # each block keeps its input (T5Block is a GradientCheckpointingLayer)
        kept = bart_residual(dt) if adapters is not None and facts.kind == "bart" else dt.residual
        saved = kept * h * (n_enc * src + n_dec * tgt) + outside
        if adapters is not None:
            extra, freed, (enc_peak, dec_peak), mlp_freed = frozen_checkpointed_parts(
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
    residual = bart_residual(dt) if adapters is not None and facts.kind == "bart" else dt.residual  # its gradients
    backward_temp = tokens * (2 * residual * h + 2 * cb * shape.intermediate_size)
    if not eager and facts.kind == "t5" and adapters is None:  # the memory-efficient kernel's bias gradient at the batch's full shape
        backward_temp += cb * b * shape.num_attention_heads * max(src_len, tgt_len) ** 2
    return dict(saved_bytes=saved, logits_bytes=logits, loss_transient_bytes=loss, layer_bytes=layer,
                recompute_bytes=layer if checkpointing else 0, backward_temp_bytes=backward_temp,
                returned_logits_bytes=tgt * V * cb, outside_freed_bytes=freed, recompute_end_bytes=recompute_end,
                mlp_freed_bytes=mlp_freed)
