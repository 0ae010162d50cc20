"""A checkpointed block of a frozen T5 / BART with LoRA adapters: the largest point of its recomputation in
backward, where the recomputed saved tensors so far sit beside the forward's own locals. Imported by
``advisor.estimate.activations_encdec`` (``frozen_checkpointed_parts``), which hands the excess over the block's
saved tensors to the memory model as ``recompute_end_bytes``, with what a checkpointed frozen base keeps outside
the blocks; not here: what a block saves (``activations_encdec_frozen``).

torch.utils.checkpoint (non-reentrant) recomputes a block's forward when its backward first unpacks a saved
tensor, with the incoming gradient of the block's output already allocated, and runs it to the last tensor the
block saved (``_StopRecomputationError``). While it runs, the recomputed saved tensors accumulate and the Python
frames of the block's forward hold their locals, as in any forward. Read op by op on the simulated step
(``advisor.simulate``, tiny T5 and BART, 128 wide, d_ff 320, 4 heads, s 128, a bf16 base under autocast with fp32
adapters, DDP): the block's backward peaks at one of these points, each matched within 6 KiB (the rsqrt and
LayerNorm statistics, left out as in the saved count):

- T5, inside an attention (eager): the attention's output (its ``matmul`` result and the ``contiguous`` copy for
  ``o``), the attention probabilities after dropout, which ``eager_attention_forward`` returns (fp32 under CUDA
  autocast: the softmax's dtype), the q, k and v projections (``T5Attention``'s locals; the matmuls save their own
  copies) and the norm's output (``normed_hidden_states``); with ``o`` adapted, inside its adapter instead.
- T5, the block's frame keeps the probabilities of its last finished attention: ``T5Block.forward`` unpacks them
  into ``_`` (``hidden_states, position_bias, _ = self.layer[0](...)``), live through the next sublayers.
- Inside an adapted linear, PEFT's ``lora.Linear.forward`` at ``lora_B(lora_A(x)) * scaling``: its input, PEFT's
  copy of it in the adapter's dtype (``_cast_input_dtype``: fp32 adapters over a bf16 base), the base layer's
  output, ``lora_B``'s output and the product. With ``wo`` (``fc2``) adapted this is the block's peak: the feed-
  forward's activation (T5: after its dropout; BART: GELU's output) is live too, and the norm's output (T5) or the
  residual (BART, ``residual = hidden_states``).
- T5, at the activation's dropout: its input and output beside the norm's output (gated, CUDA autocast: both fp32,
  the product of gelu_new's fp32 output and wi_1's).
- At the block's end (no ``wo`` / ``fc2`` adapter): T5's last dropout (``wo``'s output and the dropped copy), BART's
  last LayerNorm (its output beside the residual it normalises).
- BART under SDPA: the decoder's boolean causal mask becomes a float additive mask (``where``) that the kernel
  saves, a (b, 1, t, t) tensor in the compute dtype, made again by each recomputed self-attention.
- Below the top decoder block the encoder output's gradient (its cross-attention k and v inputs) exists, and the
  top block's input is gone: src - tgt residual-wide tokens more.

Measured (``tests/estimate/test_encdec_lora_ckpt.py``): before, the estimate took the block's saved tensors plus
its backward's gradients, -3.8% (T5 all-linear), -6.3% (BART all-linear) against the simulated step.
Pure functions, integer bytes.
"""

from __future__ import annotations

from typing import Any

from advisor.estimate.activations_encdec_frozen import (BOOL, adapter_bytes, adapter_weight_casts, bart_residual,
                                                          frozen_t5_activation, frozen_t5_norm, t5_softmax_bytes)
from advisor.precision import FP32


def _adapted(ad: Any, stack: str, module: str, leaves: tuple[str, ...]) -> list[tuple[int, str]]:
    """The adapters of ``stack`` on ``module``'s linears named ``leaves`` (``adapter_inputs``' sources)."""
    return [(fan_in, source) for fan_in, source in ad.inputs if source.startswith(f"{stack}:{module}")
            and source.split(".")[-1] in leaves]


def _in_adapter(dt: Any, ad: Any, fan_in: int, fan_out: int, tokens: int) -> int:
    """Locals inside one adapted linear at ``lora_B(...) * scaling``: its input (the merged heads, the dropped
    activation), PEFT's copy of it in the adapter's dtype (autocast: fp32 adapters), the base output, ``lora_B``'s
    output and the product. Without casts or dropout ``lora_A`` saves that very input, counted with the adapters'
    saved tensors already (read on the simulated step: tiny BART all-linear under FSDP2, checkpointed, fc2's input
    counted twice put the top block's recomputation 327,680 bytes over at micro-batch 4 x 128). PEFT's fp32 adapters
    without autocast (``dt.adapter``): ``lora_A`` saves the fp32 copy (counted with the adapters' saved tensors), so
    the layer's own input is live beside it, and so is the fp32 copy the dropout read; ``lora_B``'s output and the
    product are fp32 (the base output the compute dtype). Read on the simulated step (tiny T5 and BART, all-linear r8,
    DDP x2, checkpointed, pure bf16): -3.7% to -8.2% before, within 1.1% with it."""
    if dt.adapter is not None:
        return tokens * (dt.compute * fan_in + (dt.adapter * fan_in if ad.dropout else 0)
                         + (dt.compute + 2 * dt.adapter) * fan_out)
    own_input = 0 if not dt.input_casts and not ad.dropout else dt.compute * fan_in
    return tokens * ((FP32 * fan_in if dt.input_casts else 0) + own_input + 3 * dt.compute * fan_out)


def _t5_points(shape: Any, dt: Any, ad: Any, adapters: Any, *, stack: str, tokens: int, src: int, len_q: int,
               src_len: int, eager: bool, grad: int) -> list[int]:
    """The candidate points of one T5 block's recomputation (module docstring), bytes a micro-batch. ``adapters``:
    a list of adapters' bytes a token (``adapter_bytes``, 0 for none)."""
    h, F, cb, R = shape.hidden_size, shape.intermediate_size, dt.compute, dt.residual
    n, heads = shape.num_attention_heads * shape.head_dim, shape.num_attention_heads
    probs_b = t5_softmax_bytes(dt)  # the softmax's dtype (CUDA autocast: fp32), kept by dropout's output
    # The dropped probabilities (T5Block's ``_``) are a tensor of their own only where autocast casts them for the AV
    # matmul; without autocast the matmul saves them as they are, counted in ``core`` (read on the simulated step:
    # tiny T5 q,v under FSDP2, checkpointed: bf16 probabilities, 1,024 bytes a token an attention, counted twice).
    extra_probs_b = probs_b if dt.input_casts else 0
    norm = frozen_t5_norm(h, dt)
    saved = -tokens * R * h  # the first norm's input is the block's input: kept by the checkpoint, not recomputed
    previous, points = 0, []
    attentions = [("SelfAttention", tokens, len_q)]
    attentions += [("EncDecAttention", src, src_len)] if stack == "decoder" else []
    for module, kv_tokens, kv_len in attentions:
        q, kv = _adapted(ad, stack, module, ("q",)), _adapted(ad, stack, module, ("k", "v"))
        o = _adapted(ad, stack, module, ("o",))
        core = ((probs_b + BOOL + cb) * heads * kv_len) if eager else cb * n + FP32 * heads
        saved += (tokens * (norm + cb * n + core) + kv_tokens * 2 * cb * n + tokens * adapters(q)
                  + kv_tokens * adapters(kv))
        probs = tokens * extra_probs_b * heads * kv_len if eager else 0
        projections = tokens * cb * n + kv_tokens * 2 * cb * n if eager else 0  # SDPA saves them as they are
        frame = previous + tokens * R * h + projections + probs + grad  # + the norm's output
        points.append(saved + frame + tokens * cb * n * (2 if eager else 1))  # the output, its contiguous copy
        if o:
            points.append(saved + tokens * adapters(o) + frame + _in_adapter(dt, ad, n, h, tokens))
        saved += tokens * (adapters(o) + BOOL * h)  # + the output dropout's mask
        previous = probs  # T5Block's ``_``
    wi, wo = _adapted(ad, stack, "DenseReluDense", ("wi", "wi_0", "wi_1")), _adapted(ad, stack, "DenseReluDense",
                                                                                       ("wo",))
    saved += tokens * (norm + frozen_t5_activation(shape, dt) + BOOL * F + adapters(wi))
    # the activation's dropout: its input and output (gated: the product, widened as gelu_new's output is)
    dropped = 2 * (FP32 if dt.input_casts else cb) * F if shape.encdec.gated else cb * F
    points.append(saved + previous + tokens * (R * h + dropped) + grad)
    saved += tokens * adapters(wo)
    if wo:  # inside wo's adapter: the norm's output, the dropped activation (wo's input), the adapter's locals
        points.append(saved + previous + tokens * R * h + _in_adapter(dt, ad, F, h, tokens) + grad)
    else:  # the last dropout: wo's output and its dropped copy
        points.append(saved + tokens * BOOL * h + previous + tokens * 2 * cb * h + grad)
    return points


def _bart_points(shape: Any, dt: Any, ad: Any, adapters: Any, *, stack: str, tokens: int, src: int, b: int,
                 len_q: int, src_len: int, eager: bool, grad: int, residual: int) -> list[int]:
    """The candidate points of one BART block's recomputation (module docstring), bytes a micro-batch."""
    h, F, cb = shape.hidden_size, shape.intermediate_size, dt.compute
    n, heads = shape.num_attention_heads * shape.head_dim, shape.num_attention_heads
    saved = 0 if eager or stack == "encoder" else cb * b * len_q * len_q  # SDPA's float causal mask
    points, frame = [], 0  # the block's input, kept by the checkpoint, is the first residual
    attentions = [("self_attn", tokens, len_q)] + ([("encoder_attn", src, src_len)] if stack == "decoder" else [])
    for module, kv_tokens, kv_len in attentions:
        qkv = _adapted(ad, stack, module, ("q_proj",)), _adapted(ad, stack, module, ("k_proj", "v_proj"))
        o = _adapted(ad, stack, module, ("out_proj",))
        core = ((FP32 + cb) if dt.input_casts else cb) * heads * kv_len if eager else cb * n + FP32 * heads
        saved += tokens * (cb * n + core + adapters(qkv[0])) + kv_tokens * (2 * cb * n + adapters(qkv[1]))
        if o:  # the merged heads (reshaped), then out_proj's adapter
            points.append(saved + tokens * adapters(o) + frame + _in_adapter(dt, ad, n, h, tokens)
                          + grad)
        saved += tokens * (adapters(o) + BOOL * h + residual * h)  # the output dropout's mask, the LayerNorm's input
        frame = tokens * residual * h  # the LayerNorm's output: the next sublayer's ``residual``
    fc1, fc2 = _adapted(ad, stack, "", ("fc1",)), _adapted(ad, stack, "", ("fc2",))
    act_dropout = BOOL * F if shape.encdec.activation_dropout else 0
    saved += tokens * (adapters(fc1) + cb * F + act_dropout)
    if fc2:  # inside fc2's adapter: GELU's output (fc2's input) and the adapter's locals
        points.append(saved + tokens * adapters(fc2) + frame + _in_adapter(dt, ad, F, h, tokens) + grad)
    saved += tokens * (adapters(fc2) + BOOL * h + residual * h)
    points.append(saved + frame + tokens * residual * h + grad)  # the last LayerNorm's output
    return points


def recompute_peak_bytes(shape: Any, dt: Any, ad: Any, *, micro_batch_size: int, src_len: int, tgt_len: int,
                         eager: bool) -> tuple[int, int]:
    """The largest point of a checkpointed block's recomputation, (encoder, decoder), beyond the tensors kept
    outside it: its recomputed saved tensors so far, its forward's locals and the incoming gradient."""
    b, facts, h = micro_batch_size, shape.encdec, shape.hidden_size
    src, tgt = b * src_len, b * tgt_len
    residual = dt.residual if facts.kind == "t5" else bart_residual(dt)

    def per_token(inputs: list[tuple[int, str]]) -> int:
        return adapter_bytes(dt, ad, inputs) if inputs else 0

    peaks = []
    for stack, tokens, len_q in (("encoder", src, src_len), ("decoder", tgt, tgt_len)):
        casts = adapter_weight_casts(shape, dt, ad, [i for i in ad.inputs if i[1].startswith(f"{stack}:")])
        grad = tokens * residual * h
        if stack == "decoder" and facts.num_decoder_layers > 1:  # a lower block: the encoder output's gradient,
            grad += max(0, src - tgt) * residual * h  # the top block's input gone
        kw = dict(stack=stack, tokens=tokens, src=src, len_q=len_q, src_len=src_len, eager=eager, grad=grad)
        if facts.kind == "bart":
            points = _bart_points(shape, dt, ad, per_token, b=b, residual=residual, **kw)
        else:
            points = _t5_points(shape, dt, ad, per_token, **kw)
        peaks.append(casts + max(points))
    return peaks[0], peaks[1]


def frozen_checkpointed_parts(shape: Any, dt: Any, ad: Any, *, micro_batch_size: int, src_len: int, tgt_len: int,
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
    freed = tgt * (frozen_t5_norm(h, dt) + BOOL * h) if t5 else 0
    residual = dt.residual if t5 else bart_residual(dt)
    peaks = recompute_peak_bytes(shape, dt, ad, micro_batch_size=b, src_len=src_len, tgt_len=tgt_len, eager=eager)
    last = [i for i in ad.inputs if i[1].startswith(f"{top_stack}:") and i[1].split(".")[-1] in ("wo", "fc2")]
    tokens = b * (tgt_len if top_stack == "decoder" else src_len)
    mlp_freed = tokens * (BOOL * h + (0 if t5 else residual * h) + (adapter_bytes(dt, ad, last) if last else 0))
    return kept, freed, peaks, mlp_freed
