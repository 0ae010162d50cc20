"""Activation memory from a traced ``BlockProfile`` instead of a formula.

A profile (``advisor.model.block_profile``) holds the bytes live at each moment the memory model
composes, measured on the model itself (``advisor.simulate.profile``); this module turns it into the
``ActivationEstimate`` the formulas produce, so ``advisor.estimate.memory`` composes the step the
same way for both. Pure: no torch, no file access.
"""

from __future__ import annotations

from advisor.estimate.activations import ActivationEstimate, Dtypes
from advisor.model.block_profile import BlockProfile, CheckpointMode, ProfileKey
from advisor.model.spec import ModelSpec
from advisor.training import TrainingConfig


def profile_key(dtypes: Dtypes, training: TrainingConfig, *, checkpointing: bool) -> ProfileKey:
    mode: CheckpointMode = "off"
    if checkpointing:
        mode = "selective" if training.activation_checkpointing == "selective" else "on"
    return ProfileKey(residual_bytes=dtypes.residual, compute_bytes=dtypes.compute, input_casts=dtypes.input_casts,
                      checkpointing=mode, seq_len=training.seq_len, attention=training.attention, loss=training.loss)


def find_profile(spec: ModelSpec, key: ProfileKey) -> BlockProfile | None:
    return next((p for p in spec.traced if p.key == key), None)


def activations_from_profile(profile: BlockProfile, *, num_layers: int, micro_batch_size: int,
                             vocab_size: int) -> ActivationEstimate:
    """The profile's moments at ``num_layers`` blocks and ``micro_batch_size``: each moment's measured
    peak less the saved bytes is what the formula calls that moment's transient."""
    at = dict(num_layers=num_layers, micro_batch_size=micro_batch_size)
    saved = profile.saved.at(**at)
    block_excess = max(0, profile.block_peak.at(**at) - saved)
    recompute = min(block_excess, max(0, profile.recompute.at(**at)))
    key = profile.key
    tokens = micro_batch_size * key.seq_len
    return ActivationEstimate(
        saved_bytes=saved,
        logits_bytes=max(0, profile.forward_peak.at(**at) - saved),
        loss_transient_bytes=max(0, profile.loss_peak.at(**at) - saved),
        layer_bytes=profile.layer_saved_per_sample * micro_batch_size,
        recompute_bytes=recompute,
        backward_temp_bytes=block_excess - recompute,
        returned_logits_bytes=tokens * vocab_size * key.compute_bytes if key.loss == "hf" else 0,
    )


def needs_trace(spec: ModelSpec, training: TrainingConfig) -> str | None:
    """Why this plan should trace the model (None: the formula applies, or tracing cannot help).
    Full fine-tunes of a language model whose family has no activation formula."""
    from advisor.estimate.activations import activation_family

    if not spec.has_architecture or spec.model_type is None or activation_family(spec.model_type) is not None:
        return None
    if spec.encdec is not None:  # T5, BART: both stacks have a formula (advisor.estimate.activations_encdec)
        return None
    if training.lora is not None or spec.trainable_params < spec.total_params:
        return None  # frozen weights save less; the traced profile is measured with every weight training
    return f"no activation formula for model_type {spec.model_type}"


def trace_keys(training: TrainingConfig, dtypes: list[Dtypes]) -> list[ProfileKey]:
    """The profiles a plan reads: each recipe's dtypes x each checkpointing mode it may try."""
    modes = {"auto": (False, True), "off": (False,), "on": (True,), "selective": (True,)}[
        training.activation_checkpointing]
    keys = [profile_key(d, training, checkpointing=c) for d in dtypes for c in modes]
    if training.activation_checkpointing == "auto":  # the planner tries selective and full
        selective = training.model_copy(update={"activation_checkpointing": "selective"})
        keys += [profile_key(d, selective, checkpointing=True) for d in dtypes]
    return list(dict.fromkeys(keys))
