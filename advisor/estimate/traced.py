"""Activation memory from a traced ``BlockProfile`` instead of a formula.

A profile (``advisor.model.block_profile``) holds the bytes live at each moment the memory model
composes, measured on the model itself (``advisor.simulate.profile``); this module turns it into the
``ActivationEstimate`` the formulas produce, so ``advisor.estimate.memory`` composes the step the
same way for both. Pure: no torch, no file access.
"""

from __future__ import annotations

from advisor.estimate.activations import ActivationEstimate, Dtypes
from advisor.estimate.activations_loss import loss_bytes
from advisor.frozen import validated_copy
from advisor.model.block_kinds import kind_of
from advisor.model.block_profile import AdapterKey, Bilinear, BlockProfile, CheckpointMode, ProfileKey
from advisor.model.spec import ModelSpec
from advisor.precision import FP32
from advisor.training import TrainingConfig


def profile_key(dtypes: Dtypes, training: TrainingConfig, *, checkpointing: bool) -> ProfileKey:
    mode: CheckpointMode = "off"
    if checkpointing:
        mode = "selective" if training.activation_checkpointing == "selective" else "on"
    lora = training.lora
    adapters = None if lora is None else AdapterKey(
        rank=lora.rank, targets=(lora.targets,) if isinstance(lora.targets, str) else lora.targets, dora=lora.dora,
        dropout=lora.dropout)
    return ProfileKey(residual_bytes=dtypes.residual, compute_bytes=dtypes.compute, input_casts=dtypes.input_casts,
                      checkpointing=mode, seq_len=training.seq_len, attention=training.attention, loss=training.loss,
                      adapters=adapters)


# Causal-LM families with an activation formula of their own that knows no frozen base (LoRA traces them).
_FULL_FINE_TUNE_FORMULAS = ("gpt2", "gpt_neox")

_MOMENTS = ("saved", "forward_peak", "loss_peak", "block_peak", "recompute")


def find_profile(spec: ModelSpec, key: ProfileKey) -> BlockProfile | None:
    """The profile traced for ``key``; for a length no profile was traced at (the ``--seq-len max``
    search steps through lengths before it traces the one it found), one made from those traced with
    the same recipe at other lengths: linear in the length between (or beyond) the two nearest, each
    coefficient on its own (a sliding-window mask grows as s^2, the saved tensors as s); from a single
    one, its per-sample terms scaled by the tokens (memory is linear in b x s under SDPA)."""
    exact = next((p for p in spec.traced if p.key == key), None)
    if exact is not None:
        return exact
    same = sorted((p for p in spec.traced if validated_copy(p.key, {"seq_len": key.seq_len}) == key),
                  key=lambda p: abs(p.key.seq_len - key.seq_len))
    if not same:
        return None
    if len(same) == 1:
        return _scaled(same[0], key)
    return _interpolated(same[0], same[1], key)


def _scaled(profile: BlockProfile, key: ProfileKey) -> BlockProfile:
    ratio = key.seq_len / profile.key.seq_len

    def scale(b: Bilinear) -> Bilinear:
        return validated_copy(b, dict(per_sample=round(b.per_sample * ratio),
                                        per_layer_sample=round(b.per_layer_sample * ratio)))

    return validated_copy(profile, dict(key=key, layer_saved_per_sample=round(profile.layer_saved_per_sample * ratio),
                                          **{name: scale(getattr(profile, name)) for name in _MOMENTS}))


def _interpolated(a: BlockProfile, b: BlockProfile, key: ProfileKey) -> BlockProfile:
    t = (key.seq_len - a.key.seq_len) / (b.key.seq_len - a.key.seq_len)

    def line(x: int, y: int) -> int:
        return round(x + (y - x) * t)

    def blend(x: Bilinear, y: Bilinear) -> Bilinear:
        return Bilinear(**{field: line(getattr(x, field), getattr(y, field)) for field in Bilinear.model_fields})

    return validated_copy(a, dict(key=key, layer_saved_per_sample=max(0, line(a.layer_saved_per_sample,
                                                                                   b.layer_saved_per_sample)),
                                    **{name: blend(getattr(a, name), getattr(b, name)) for name in _MOMENTS}))


def _tied_head_bend(key: ProfileKey, *, micro_batch_size: int, vocab_size: int, hidden_size: int) -> int:
    """transformers' loss (hf) over a tied head: the line's miss at the loss backward. The head's weight
    gradient of a tied head is no parameter gradient yet (autograd holds it until the embedding's arrives;
    the tracer counts it), so the loss backward peaks at the larger of two points: log_softmax_backward
    (the saved log-softmax, the NLL gradient and its output, fp32: ``activations_loss.loss_bytes``) and the
    head's backward (the logits' gradient, compute dtype, and the V x h weight gradient, the weight's dtype:
    the residual's where the recipe holds no fp32 master under autocast). Short sequences over a wide
    vocabulary peak at the head at micro-batch 1 and at the log-softmax from 2, so the line through the
    two traced batches is short beyond them: a tied Granite h384 V 204,864, s 128 in fp32 by one N x V
    fp32 tensor over two, 210 MB at micro-batch 4 (sweep row f61ed5515497, -11.3% on a tp 2 mesh). Not
    drawn where autocast casts fp32 weights (``input_casts``: a compute-dtype copy of the gradient too)."""
    if key.loss != "hf" or key.input_casts or not hidden_size or micro_batch_size <= 2:
        return 0

    def at(batch: int) -> int:
        tokens = batch * key.seq_len
        return max(3 * tokens * vocab_size * FP32,
                   tokens * vocab_size * key.compute_bytes + vocab_size * hidden_size * key.residual_bytes)

    t1, t2 = at(1), at(2)
    return at(micro_batch_size) - (t1 + (t2 - t1) * (micro_batch_size - 1))


def _loss_bend(key: ProfileKey, *, micro_batch_size: int, vocab_size: int, hidden_size: int) -> tuple[int, int]:
    """(end of forward, loss backward): what the loss path holds at ``micro_batch_size`` beyond the line the
    profile draws through its traced micro-batches 1 and 2. The chunked and fused kernels peak at the larger of
    two points, one of which holds head-sized gradients that do not grow with the tokens
    (``activations_loss.loss_bytes``), so a line through two traced batches misses the bend between them and
    the planned one (a chunked fp32 StableLM at micro-batch 4 was 60 MB short: one chunk's gradient)."""
    if key.loss == "hf" or not hidden_size or micro_batch_size <= 2:
        return 0, 0
    dt = Dtypes(residual=key.residual_bytes, compute=key.compute_bytes, input_casts=key.input_casts)

    def at(batch: int) -> tuple[int, int]:
        return loss_bytes(key.loss, tokens=batch * key.seq_len, vocab=vocab_size, hidden=hidden_size, dt=dt,
                          head_frozen=key.adapters is not None)

    (f1, b1), (f2, b2), (f, b) = at(1), at(2), at(micro_batch_size)
    return f - (f1 + (f2 - f1) * (micro_batch_size - 1)), b - (b1 + (b2 - b1) * (micro_batch_size - 1))


def activations_from_profile(profile: BlockProfile, *, num_layers: int, micro_batch_size: int,
                             vocab_size: int, hidden_size: int = 0, tied_head: bool = False) -> ActivationEstimate:
    """The profile's moments at ``num_layers`` blocks and ``micro_batch_size``: each moment's measured
    peak less the saved bytes is what the formula calls that moment's transient (the loss path's bend beyond
    the traced batches added: ``_loss_bend``, and ``_tied_head_bend`` where ``tied_head``; ``hidden_size`` 0
    leaves them out)."""
    at = dict(num_layers=num_layers, micro_batch_size=micro_batch_size)
    saved = max(0, profile.saved.at(**at))  # a profile made for a far length (find_profile) may extrapolate below 0
    block_excess = max(0, profile.block_peak.at(**at) - saved)
    recompute = min(block_excess, max(0, profile.recompute.at(**at)))
    key = profile.key
    tokens = micro_batch_size * key.seq_len
    # What one block's backward frees: a block's share of the saved bytes (the line's step per block).
    block_kept = saved - max(0, profile.saved.at(num_layers=num_layers - 1, micro_batch_size=micro_batch_size)) \
        if num_layers > 1 else 0
    bend_forward, bend_loss = _loss_bend(key, micro_batch_size=micro_batch_size, vocab_size=vocab_size,
                                         hidden_size=hidden_size)
    if tied_head:
        bend_loss += _tied_head_bend(key, micro_batch_size=micro_batch_size, vocab_size=vocab_size,
                                     hidden_size=hidden_size)
    # The tracer leaves out every cast of a parameter (autocast's copies, which strategy_buffers counts), the fused
    # kernel's own low-precision copy of an fp32 head among them (wrappers.losses: made with autocast off and freed
    # as its forward returns; activations_loss.loss_bytes counts it for a formula family). Only the loss's forward
    # holds it: sweep 5350eb776448 (olmo2 h128, V 9,792, DDP bf16-mixed, s4096) was 2,506,752 bytes short there.
    head_copy = vocab_size * hidden_size * key.compute_bytes \
        if key.loss == "fused" and key.input_casts and key.residual_bytes != key.compute_bytes else 0
    return ActivationEstimate(
        saved_bytes=saved,
        logits_bytes=max(0, profile.forward_peak.at(**at) - saved + bend_forward + head_copy),
        loss_transient_bytes=max(0, profile.loss_peak.at(**at) - saved + bend_loss),
        layer_bytes=profile.layer_saved_per_sample * micro_batch_size,
        recompute_bytes=recompute,
        backward_temp_bytes=block_excess - recompute,
        returned_logits_bytes=tokens * vocab_size * key.compute_bytes if key.loss == "hf" else 0,
        block_kept_bytes=max(0, block_kept),
    )


def saved_head_gradient(spec: ModelSpec, key: ProfileKey) -> int:
    """The bytes of a profile's saved line (``BlockProfile.saved``) that are a tied head's weight gradient: the
    saved bytes are read when the blocks' backward begins, where the head's gradient of a tied full fine-tune
    waits in autograd's input buffer for the embedding's (``_tied_head_bend``; the weights' dtype, the
    residual's: the tracer's fp32 weights under autocast get the fp32 cast-back). The forward and the start
    of the loss backward do not hold it. 0 without a profile for ``key``, untied, or with a frozen head."""
    tied = bool(spec.tied_embeddings) and spec.head is None and spec.trainable_params >= spec.total_params
    if not tied or not spec.traced or find_profile(spec, key) is None:
        return 0
    return (spec.vocab_size or 0) * (spec.hidden_size or 0) * key.residual_bytes


def needs_trace(spec: ModelSpec, training: TrainingConfig) -> str | None:
    """Why this plan should trace the model (None: the formula applies, or tracing cannot help).
    Full fine-tunes and LoRA (PEFT's adapters traced with the model) of a language model whose family has
    no activation formula, and LoRA on GPT-2 and GPT-NeoX, whose own formulas count a full fine-tune's
    activations (what a frozen base does not save, and the adapters' inputs, are modelled for Llama-like
    blocks only: ``advisor.model.lora.adapter_inputs``; +43% on a GPT-NeoX at s 8192 in the sweep)."""
    from advisor.estimate.activations import activation_family

    if not spec.has_architecture or spec.model_type is None:
        return None
    family = activation_family(spec.model_type)
    if family is not None and not (training.lora is not None and family in _FULL_FINE_TUNE_FORMULAS):
        return None
    if kind_of(spec).family == "encdec":  # T5, BART: both stacks have a formula (advisor.estimate.activations_encdec)
        return None
    if training.quantize is not None:
        return None  # a quantised base's dequantised weights are not traced
    if training.lora is None and spec.trainable_params < spec.total_params:
        return None  # frozen weights save less; the traced profile is measured with every weight training
    if family is not None:
        return f"LoRA on {spec.model_type}: its activation formula models a full fine-tune only"
    return f"no activation formula for model_type {spec.model_type}"


def trace_keys(training: TrainingConfig, dtypes: list[Dtypes]) -> list[ProfileKey]:
    """The profiles a plan reads: each recipe's dtypes x each checkpointing mode it may try."""
    modes = {"auto": (False, True), "off": (False,), "on": (True,), "selective": (True,)}[
        training.activation_checkpointing]
    keys = [profile_key(d, training, checkpointing=c) for d in dtypes for c in modes]
    if training.activation_checkpointing == "auto":  # the planner tries selective and full
        selective = validated_copy(training, {"activation_checkpointing": "selective"})
        keys += [profile_key(d, selective, checkpointing=True) for d in dtypes]
    return list(dict.fromkeys(keys))
