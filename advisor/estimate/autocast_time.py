"""Time of autocast's weight casts, per micro-batch on one GPU (read by ``step_time``).

What belongs here: the HBM bytes ``torch.autocast`` moves casting fp32 weights to the compute dtype, and their
seconds. Where it applies: bf16-mixed (or fp16-mixed) over fp32 weights held as they are, the recipe's
``recipe_dtypes`` with an fp32 residual and input casts: DDP, ZeRO-1, DataParallel and one GPU under the torch
engine. FSDP2's MixedPrecisionPolicy casts a rank's shard once an all-gather (1/N of the weights), DeepSpeed and
pure bf16 hold bf16 weights, and a LoRA base held in bf16 is not cast: none of those pays it.

The mechanism (torch/csrc/autograd and aten/src/ATen/autocast_mode.cpp): every linear's fp32 weight is cast
to the compute dtype when a matmul first reads it inside an autocast region (``cached_cast``: one cast a
weight a region; Lightning's ``cache_enabled=False`` casts at every use, the same once a linear), an
elementwise ``_to_copy`` that reads 4 bytes and writes 2 a weight. Backward runs that cast's backward on the
weight's gradient, read 2 and write 4 (``ToCopyBackward0``), for the weights that train. A checkpointed block
casts its weights again in the recompute (non-reentrant checkpointing replays the forward under the saved
autocast state: a new region). So, per micro-batch, w the cast weights, t of them trainable, c the compute
dtype's width: forward w (4 + c), backward t (4 + c) + b (4 + c) when checkpointed, b the blocks' weights among
the w.

Counted: every parameter but an untied input embedding (an ``embedding`` lookup is not on autocast's list; the
norms' weights, a small share, are counted too: an over-charge) and a quantised base's linears (bitsandbytes
dequantises them to the compute dtype: ``quantized.dequantization_step_s``); a QLoRA model's fp32 head is cast. Not counted: accumulating the gradient into
``.grad`` across micro-batches (``AccumulateGrad``'s add from the second micro-batch of a step on).

The casts' bandwidth was measured on an H100 (benchmarks/gpu_cast_bandwidth.py): fp32 -> bf16 one tensor at a time
reaches 0.84 of the datasheet, bf16 -> fp32 0.55.

Seen on an H100 (benchmarks/results/gpu_speed.md, the plain model under bf16 autocast, fused AdamW): Llama-3.2-3B
at micro-batch 1 x 2048 under full checkpointing spends its step's elementwise time on these casts (the profile
of that run), which the plan's matmul utilisation, fitted on FSDP runs that cast only shards, never saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.precision import FP32

if TYPE_CHECKING:
    from advisor.hardware.cluster import Hardware
    from advisor.hardware.efficiency import EfficiencyProfile
    from advisor.model.spec import ModelSpec
    from advisor.strategies import Implementation
    from advisor.training import TrainingConfig


def num_cast_weights(spec: "ModelSpec", training: "TrainingConfig") -> tuple[int, int]:
    """(weights autocast casts once a forward, those of them a checkpointed block's recompute casts again).

    A forward casts every parameter but an untied input embedding, a 4-bit or 8-bit base's quantised linears
    (bitsandbytes dequantises those to the compute dtype itself: ``quantized``) and, under ``--float8``, the blocks'
    converted linears (torchao's Float8Linear casts its fp32 weight straight to fp8, counted by ``float8_time``).
    The recompute runs the blocks only (HF's and torchtitan's checkpointing wrap each decoder layer), so the input
    embedding, the head (a tied one too) and the final norm are not cast again; where the spec does not split its
    parameters, every cast weight is counted again (an over-charge)."""
    lookup = spec.embedding_params if (spec.embedding_params and spec.tied_embeddings is False) else 0
    skipped = 0
    if training.quantize is not None:
        from advisor.estimate.quantized import quantized_base

        skipped += quantized_base(spec, training.quantize, double_quant=training.double_quant).params
    if training.float8:
        from advisor.estimate.float8_time import float8_linears

        skipped += spec.num_layers * sum(k * n for k, n in float8_linears(spec))
    forward = max(spec.total_params - lookup - skipped, 0)
    outside = (spec.embedding_params, spec.head_params, spec.other_params)
    recompute = forward if None in outside else max(spec.total_params - sum(outside) - skipped, 0)  # type: ignore[arg-type]
    return forward, min(recompute, forward)


def _cast_bytes(spec: "ModelSpec", training: "TrainingConfig", impl: "Implementation", *,
                checkpointing: bool) -> tuple[int, int, int]:
    """(forward casts down, the recompute's casts down, the gradients' casts up) in bytes, one micro-batch."""
    from advisor.estimate.memory import recipe_dtypes

    dt = recipe_dtypes(training, impl)
    if not (dt.input_casts and dt.residual == FP32 and dt.compute < FP32):
        return 0, 0, 0
    per_weight = FP32 + dt.compute
    forward, recompute = num_cast_weights(spec, training)
    trainable = min(spec.trainable_params, forward)
    return forward * per_weight, (recompute * per_weight if checkpointing else 0), trainable * per_weight


def autocast_cast_bytes(spec: "ModelSpec", training: "TrainingConfig", impl: "Implementation", *,
                        checkpointing: bool) -> tuple[int, int]:
    """(forward, backward) HBM bytes of autocast's weight casts in one micro-batch; (0, 0) where the recipe
    does not cast fp32 weights under autocast (the module docstring)."""
    down, recompute, up = _cast_bytes(spec, training, impl, checkpointing=checkpointing)
    return down, recompute + up


def autocast_cast_s(spec: "ModelSpec", hw: "Hardware", training: "TrainingConfig", impl: "Implementation",
                    eff: "EfficiencyProfile", *, checkpointing: bool) -> tuple[float, float]:
    """(forward, backward) seconds of the casts a micro-batch, on the compute stream (they add to compute): the
    weights' casts down at the GPU's HBM bandwidth x ``autocast_casts.down_hbm_efficiency``, the gradients' casts
    up at ``up_hbm_efficiency`` (measured apart on an H100: benchmarks/results/gpu_cast_bandwidth.md)."""
    return _cast_seconds(*_cast_bytes(spec, training, impl, checkpointing=checkpointing), hw, eff)


def _cast_seconds(down: int, again: int, up: int, hw: "Hardware", eff: "EfficiencyProfile") -> tuple[float, float]:
    """(forward, backward) seconds of casts down in forward, down again in backward and up in backward, at the shares
    of HBM bandwidth measured for casts down and up (0, 0 where nothing is cast)."""
    if not down:
        return 0.0, 0.0
    cost, datasheet = eff.autocast_casts, hw.gpu.hbm_bandwidth_gbps * 1e9
    return down / (datasheet * cost.down_hbm_efficiency), (again / (datasheet * cost.down_hbm_efficiency)
                                                           + up / (datasheet * cost.up_hbm_efficiency))


def autocast_cast_note(seconds: float, hw: "Hardware", eff: "EfficiencyProfile", *, checkpointing: bool) -> str:
    cost = eff.autocast_casts
    return (f"autocast casts the fp32 weights to the compute dtype in forward{' and again in the recompute' if checkpointing else ''}"
            f", and the trainable ones' gradients back in backward: {seconds:.3f} s a micro-batch at "
            f"{cost.down_hbm_efficiency:.0%} / {cost.up_hbm_efficiency:.0%} of {hw.gpu.hbm_bandwidth_gbps:,.0f} GB/s "
            "(down / up, measured on an H100)")


def one_rank_cast_s(spec: "ModelSpec", hw: "Hardware", training: "TrainingConfig", impl: "Implementation",
                    eff: "EfficiencyProfile") -> tuple[float, float]:
    """(forward, backward) seconds of FSDP2's casts a micro-batch on a group of one rank
    (``fsdp2_one_rank.one_rank_cast_bytes``), at the shares of HBM bandwidth measured for casts down and up."""
    from advisor.estimate.fsdp2_one_rank import one_rank_cast_bytes

    return _cast_seconds(*one_rank_cast_bytes(spec, training, reshard_after_forward=impl.reshard_after_forward), hw, eff)


def one_rank_cast_note(seconds: float, hw: "Hardware", eff: "EfficiencyProfile") -> str:
    cost = eff.autocast_casts
    return (f"FSDP2 on one rank casts every fp32 parameter to the compute dtype at each unshard and the gradients back "
            f"for its reduce: {seconds:.3f} s a micro-batch at {cost.down_hbm_efficiency:.0%} / "
            f"{cost.up_hbm_efficiency:.0%} of {hw.gpu.hbm_bandwidth_gbps:,.0f} GB/s (down / up, measured on an H100)")
