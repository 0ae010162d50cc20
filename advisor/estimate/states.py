"""Model states per rank: parameters, gradients and optimizer state where they rest, and the
optimizer step's temporaries, by engine (split from ``advisor.estimate.memory``, which composes them
with activations and buffers into the step's moments).

torch (the recipe ``wrap()`` runs): mixed precision keeps fp32 parameters; FSDP2 shards parameters,
gradients and optimizer state together; ZeroRedundancyOptimizer shards only the optimizer state, never
splitting a tensor. deepspeed: 2 bytes/param weights, 2 grads and K=12 (fp32 master + Adam), the ZeRO
paper's accounting (Rajbhandari et al. 2020, section 3/5).

The Adam/AdamW step's temporaries follow the implementation (``TrainingConfig.optimizer_implementation``,
the recipe's unless --optimizer-impl), read from torch/optim/adam.py (torch 2.13):

- foreach (``_multi_tensor_adam``): ``torch._foreach_sqrt(exp_avg_sqs)`` allocates one temporary the
  size of the second moment, divided and added to in place, alive until the update is applied;
- fused (``_fused_adam``: ``torch._fused_adamw_``): one multi-tensor kernel updates the parameters and
  both moments in place; nothing the size of a state is allocated (the step counters are 0-d tensors);
- for-loop (``_single_tensor_adam``): one tensor at a time, ``denom = (exp_avg_sq.sqrt() /
  bias_correction2_sqrt).add_(eps)``: the square root and the quotient of the largest tensor coexist,
  two temporaries of its size (its local shard under FSDP2).

Each is checked against the simulator running ``torch.optim.AdamW(fused=True / foreach=True /
foreach=False)`` (tests/estimate/test_optimizer_impl.py, benchmarks/optimizer_impl.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.optimizer_8bit import EIGHT_BIT_OPTIMIZERS, eight_bit_state_bytes
from advisor.frozen import validated_copy
from advisor.model.spec import ModelSpec
from advisor.precision import FP32
from advisor.strategies import Implementation
from advisor.training import TrainingConfig



class ModelStates(BaseModel):
    """Bytes of parameters, gradients and optimizer state per rank, where they rest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    params: int
    grads: int
    optimizer: int
    step_temporary: int = Field(description="Optimizer-step temporaries on the device that steps.")
    on_cpu: bool = Field(description="Sharded states live on the CPU (offload).")
    cpu_only_optimizer: bool = Field(default=False, description="Only optimizer-side states are on the CPU.")
    paged: int = Field(default=0, ge=0, description="Part of optimizer in CUDA managed memory (bitsandbytes' paged "
                                                    "optimizers), outside the caching allocator (in_backward).")


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
    if opt in EIGHT_BIT_OPTIMIZERS:  # two uint8 moments + fp32 absmax per block, the block by bitsandbytes release
        return eight_bit_state_bytes(t, training.bitsandbytes)
    # Adafactor: factored second moment, one row and one column vector per matrix (Shazeer & Stern 2018).
    width = spec.hidden_size or 4096
    return state_bytes * 2 * t // width


def optimizer_step_temporary(training: TrainingConfig, *, trainable_bytes: int, largest_bytes: int = 0,
                             element_bytes: int | None = None) -> int:
    """Temporaries of the optimizer step over ``trainable_bytes`` of state per rank, of which the largest
    single tensor holds ``largest_bytes`` at ``element_bytes`` a value (default the trainable parameters'; see
    the module docstring for each implementation)."""
    if training.optimizer == "adafactor":
        # transformers' Adafactor (the Trainer's optim="adafactor", and what wrap() and the exports build) steps one
        # tensor at a time in Python (optimization.py, Adafactor.step): its fp32 update and the next expression's
        # result coexist (``(grad**2) + eps``, the factored estimate times the gradient, ``-update``), beside the
        # fp32 copies ``grad.float()`` and ``p.float()`` of a 16-bit gradient and parameter
        size = element_bytes or training.trainable_param_bytes
        copies = 2 if size < FP32 else 0
        return FP32 * (largest_bytes // size) * (2 + copies)
    if training.optimizer not in ("adam", "adamw"):
        return 0
    impl = training.optimizer_implementation
    if impl == "fused":
        return 0
    if impl == "for-loop":
        return 2 * largest_bytes  # sqrt(v) and sqrt(v) / bias_correction2_sqrt of one tensor
    return trainable_bytes  # foreach: _foreach_sqrt(exp_avg_sqs)


def steps_per_tensor(training: TrainingConfig) -> bool:
    """Whether the optimizer's temporaries are one tensor's at a time: a for-loop AdamW, or Adafactor."""
    return training.optimizer == "adafactor" or (training.optimizer in ("adam", "adamw")
                                                 and training.optimizer_implementation == "for-loop")


def largest_trainable_params(spec: ModelSpec, training: TrainingConfig) -> int:
    """Elements of the largest trainable tensor: an adapter matrix under LoRA (``r x max(in, out)`` of its
    widest target), else the token embedding or the head, else the widest block linear."""
    from advisor.model.lora import adapted_fans, block_linears  # LoRA's tables load only when asked

    t = spec.trainable_params
    try:
        linears = block_linears(spec)
    except ValueError:  # a family whose linears are not listed: the embedding, or all that trains
        linears = {}
    widest = max((i * o for shapes in linears.values() for i, o in shapes), default=0)
    if training.lora is not None and linears:
        return min(t, training.lora.rank * max(adapted_fans(spec, training.lora), default=0)) or t
    if t >= spec.total_params:
        return max(spec.embedding_params or 0, spec.head_params or 0, widest) or t
    return min(t, widest) or t


def compute_dtype_copy_params(spec: ModelSpec, training: TrainingConfig, impl: Implementation) -> int:
    """Trainable parameters held in the compute dtype rather than ``trainable_param_bytes``: PEFT's modules_to_save
    copies of the embedding and head that the recipe casts over an unsharded 4-bit base
    (``TrainingConfig.copies_in_compute_dtype``); 0 elsewhere."""
    if not training.copies_in_compute_dtype or impl.shard_params:
        return 0
    from advisor.model.saved_modules import compute_dtype_copies

    return compute_dtype_copies(spec, training.lora)


def _torch_states(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> ModelStates:
    pb = training.trainable_param_bytes  # a trainable parameter, its gradient and state (fp32 adapters: fp32)
    p, t = spec.total_params, spec.trainable_params
    opt = optimizer_state_bytes(spec, training, state_bytes=pb)
    stored = pb * t + training.frozen_param_bytes * (p - t)  # a LoRA base may rest in bf16 (low_precision_base)
    largest = pb * largest_trainable_params(spec, training) if steps_per_tensor(training) else 0
    # bf16 copies (0 under FSDP / ZeRO-3): their weights, gradients and torch optimizer state in bf16 (an 8-bit
    # state is unchanged)
    less = (pb - training.compute_bytes) * compute_dtype_copy_params(spec, training, impl)
    opt -= {"adam": 2, "adamw": 2, "sgd-momentum": 1}.get(training.optimizer, 0) * less
    stored -= less
    trained = pb * t - less  # the trainable parameters' bytes, and their gradients'
    if impl.shard_params:  # FSDP2: parameters, gradients and optimizer state are sharded together
        # Each tensor is sharded on dim 0: the largest local shard is about 1/world of the largest tensor.
        temp = optimizer_step_temporary(training, trainable_bytes=-(-pb * t // world), largest_bytes=-(-largest // world))
        if training.fsdp_version == 1:  # a flat parameter's gradient covers its frozen part too (fsdp1_buffers)
            from advisor.estimate.fsdp1_buffers import fsdp1_gradient_params

            t = fsdp1_gradient_params(spec, training)
        elif spec.num_experts:  # FSDP2 pads the experts' dim 0 to world x ceil(E / world) rows
            from advisor.estimate.strategy_buffers import expert_shard_padding, routed_expert_params

            all_experts, one = routed_expert_params(spec)
            dim1 = training.recipe.shard_experts_on_dim1  # the recipe's dim-1 placement pads nothing
            pad = expert_shard_padding(spec, world, dim1=dim1) * (all_experts // max(1, one))
            if pad and t >= p:
                opt, stored, t = opt + opt * pad // t, stored + pb * pad, t + pad
                temp = optimizer_step_temporary(training, trainable_bytes=-(-pb * t // world),
                                                largest_bytes=-(-largest // world))
        return ModelStates(params=-(-stored // world), grads=-(-pb * t // world), optimizer=-(-opt // world),
                           step_temporary=temp, on_cpu=impl.offload_params)
    if impl.shard_optimizer:  # ZeroRedundancyOptimizer: each rank owns and steps a slice of whole tensors
        share = max(-(-opt // world), _largest_tensor_bytes(spec, opt))
        temp = optimizer_step_temporary(training, trainable_bytes=-(-trained // world), largest_bytes=largest)
        return ModelStates(params=stored, grads=trained, optimizer=share, step_temporary=temp, on_cpu=False)
    temp = optimizer_step_temporary(training, trainable_bytes=trained, largest_bytes=largest)
    return ModelStates(params=stored, grads=trained, optimizer=opt, step_temporary=temp, on_cpu=False)


def _largest_tensor_bytes(spec: ModelSpec, opt_bytes: int) -> int:
    """Optimizer bytes of the largest trainable tensor (ZeRO-1 cannot split a tensor across ranks)."""
    if not spec.trainable_params or spec.embedding_params is None or spec.trainable_params < spec.total_params:
        return 0
    return opt_bytes * spec.embedding_params // spec.trainable_params


def _deepspeed_states(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> ModelStates:
    """ZeRO paper accounting: 2 bytes weights, 2 grads, K = 12 (fp32 master 4 + Adam 8); a recipe with
    DeepSpeed's own facts steps as ``advisor.estimate.zero_buffers`` reads them."""
    p, t = spec.total_params, spec.trainable_params
    pb = training.compute_bytes
    master = 0 if pb == 4 else FP32 * t
    # DeepSpeed hands a client optimizer each rank's flat 1-D fp32 partition; Adafactor factors only tensors of two or
    # more dims (transformers' _get_options), so it keeps the whole second moment and steps the partition as one tensor
    flat_adafactor = training.optimizer == "adafactor"
    state = FP32 * t if flat_adafactor else optimizer_state_bytes(spec, training, state_bytes=FP32)
    k_bytes = master + state
    params = pb * p // world if impl.shard_params else pb * p
    grads = pb * t // world if impl.shard_grads else pb * t
    opt = k_bytes // world if impl.shard_optimizer else k_bytes
    share = world if impl.shard_optimizer else 1
    largest = (FP32 * t if flat_adafactor else
               FP32 * largest_trainable_params(spec, training) if steps_per_tensor(training) else 0)
    temp = optimizer_step_temporary(training, trainable_bytes=FP32 * t // share, largest_bytes=-(-largest // share),
                                    element_bytes=FP32)
    from advisor.estimate.zero_buffers import zero_facts, zero_step_temporary  # ZeRO stage 1+ on the deepspeed engine

    facts = zero_facts(training, impl)
    if facts is not None:
        temp = zero_step_temporary(spec, training, impl, world, facts)
    if impl.offload_optimizer:
        # ZeRO-Offload steps DeepSpeedCPUAdam in place on the host's fp32 partition (its gradient already there), with
        # no flattened or cast copy (deepspeed/runtime/zero/stage_1_and_2.py step, the cpu_offload branch, at edaa722);
        # a client optimizer, whatever the recipe's implementation, is refused there unless zero_force_ds_cpu_optimizer
        # is false (deepspeed/runtime/engine.py _configure_basic_optimizer)
        temp = 0
    return ModelStates(params=params, grads=grads, optimizer=opt, step_temporary=temp,
                       on_cpu=impl.offload_params, cpu_only_optimizer=impl.offload_optimizer and not impl.offload_params)


def model_states(spec: ModelSpec, training: TrainingConfig, impl: Implementation, world: int) -> ModelStates:
    states = (_deepspeed_states if training.engine == "deepspeed" else _torch_states)(spec, training, impl, world)
    if training.optimizer_in_backward or training.optimizer == "adamw-8bit-paged":  # advisor.estimate.in_backward
        from advisor.estimate.in_backward import in_backward_states, paged_state_bytes

        share = world if impl.shard_optimizer else 1
        states = validated_copy(states, {"paged": min(states.optimizer, -(-paged_state_bytes(spec, training) // share))})
        if training.optimizer_in_backward and not (impl.shard_params or impl.shard_optimizer):
            states = in_backward_states(spec, training, states)
    return states
