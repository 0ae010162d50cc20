"""Model states per rank: parameters, gradients and optimizer state where they rest, and the
optimizer step's temporaries, by engine (split from ``advisor.estimate.memory``, which composes them
with activations and buffers into the step's moments).

torch (the recipe ``wrap()`` runs): mixed precision keeps fp32 parameters; FSDP2 shards parameters,
gradients and optimizer state together; ZeroRedundancyOptimizer shards only the optimizer state, never
splitting a tensor; AdamW's foreach step allocates one state-sized temporary (``sqrt(v)``,
torch/optim/adam.py ``_multi_tensor_adam``). deepspeed: 2 bytes/param weights, 2 grads and K=12 (fp32
master + Adam), the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3/5).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.spec import ModelSpec
from advisor.strategies import Implementation
from advisor.training import TrainingConfig

FP32 = 4


class ModelStates(BaseModel):
    """Bytes of parameters, gradients and optimizer state per rank, where they rest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int
    grads: int
    optimizer: int
    step_temporary: int = Field(description="Optimizer-step temporaries on the device that steps.")
    on_cpu: bool = Field(description="Sharded states live on the CPU (offload).")
    cpu_only_optimizer: bool = Field(default=False, description="Only optimizer-side states are on the CPU.")


def optimizer_state_bytes(spec: ModelSpec, training: TrainingConfig, *, state_bytes: int) -> int:
    """Optimizer state for the trainable parameters (bytes), excluding master weights."""
    t = spec.trainable_params
    opt = training.optimizer
    if opt in ("adam", "adamw"):
        return 2 * state_bytes * t  # exp_avg, exp_avg_sq
    if opt == "sgd-momentum":
        return state_bytes * t
    if opt == "sgd":
        return 0
    if opt == "adamw-8bit":
        return 2 * t + t // 256  # two 8-bit states + fp32 absmax per 2048-element block (bitsandbytes)
    # Adafactor: factored second moment, one row and one column vector per matrix (Shazeer & Stern 2018).
    width = spec.hidden_size or 4096
    return state_bytes * 2 * t // width


def optimizer_step_temporary(training: TrainingConfig, *, trainable_bytes: int) -> int:
    """Temporaries of the foreach optimizer step over ``trainable_bytes`` of fp32 parameters."""
    if training.optimizer in ("adam", "adamw", "adafactor"):
        return trainable_bytes  # _foreach_sqrt(exp_avg_sq) / factored variance estimate
    return 0


def _torch_states(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> ModelStates:
    pb = training.param_bytes
    p, t = spec.total_params, spec.trainable_params
    opt = optimizer_state_bytes(spec, training, state_bytes=pb)
    temp = optimizer_step_temporary(training, trainable_bytes=pb * t)
    if impl.shard_params:  # FSDP2: parameters, gradients and optimizer state are sharded together
        return ModelStates(params=-(-pb * p // world), grads=-(-pb * t // world), optimizer=-(-opt // world),
                           step_temporary=-(-temp // world), on_cpu=impl.offload_params)
    if impl.shard_optimizer:  # ZeroRedundancyOptimizer: each rank owns and steps a slice
        share = max(-(-opt // world), _largest_tensor_bytes(spec, opt))
        return ModelStates(params=pb * p, grads=pb * t, optimizer=share, step_temporary=-(-temp // world),
                           on_cpu=False)
    return ModelStates(params=pb * p, grads=pb * t, optimizer=opt, step_temporary=temp, on_cpu=False)


def _largest_tensor_bytes(spec: ModelSpec, opt_bytes: int) -> int:
    """Optimizer bytes of the largest trainable tensor (ZeRO-1 cannot split a tensor across ranks)."""
    if not spec.trainable_params or spec.embedding_params is None or spec.trainable_params < spec.total_params:
        return 0
    return opt_bytes * spec.embedding_params // spec.trainable_params


def _deepspeed_states(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> ModelStates:
    """ZeRO paper accounting: 2 bytes weights, 2 grads, K = 12 (fp32 master 4 + Adam 8)."""
    p, t = spec.total_params, spec.trainable_params
    pb = 4 if training.precision == "fp32" else 2
    master = 0 if pb == 4 else FP32 * t
    k_bytes = master + optimizer_state_bytes(spec, training, state_bytes=FP32)
    params = pb * p // world if impl.shard_params else pb * p
    grads = pb * t // world if impl.shard_grads else pb * t
    opt = k_bytes // world if impl.shard_optimizer else k_bytes
    temp = optimizer_step_temporary(training, trainable_bytes=FP32 * t) // (world if impl.shard_optimizer else 1)
    return ModelStates(params=params, grads=grads, optimizer=opt, step_temporary=temp,
                       on_cpu=impl.offload_params, cpu_only_optimizer=impl.offload_optimizer and not impl.offload_params)


def model_states(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> ModelStates:
    if training.engine == "deepspeed":
        return _deepspeed_states(spec, training, impl, world)
    return _torch_states(spec, training, impl, world)
