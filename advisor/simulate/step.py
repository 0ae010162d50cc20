"""Run one real training step in PyTorch, without a GPU, and measure each rank's peak memory.

``simulate(model, world_size=, strategy=, training=, micro_batch_size=, checkpointing=)`` builds
the model from its config on the meta device, gives it fake tensors (``FakeTensorMode``: shapes and
dtypes, no storage), applies the same wrapping ``wrap()`` applies (``wrappers.recipe``), and runs
two steps (forward, backward, ``optimizer.step()``, ``zero_grad``) under a fake process group of
the target world size (``torch.testing._internal.distributed.fake_pg``). With ``--global-batch`` above
micro-batch x ranks a step runs each micro-batch's forward and backward before the optimizer step
(``_Step``); the second step's micro-batches and its optimizer step are measured, the phase read from the last
micro-batch, which holds the others' gradients. The second step is measured by PyTorch's own tracker
(``torch.distributed._tools.mem_tracker.MemTracker``, or ``fsdp2_mem_tracker.FSDPMemTracker`` under FSDP2),
which counts every tensor storage the step creates, categorised. It is the analytic model's ground truth (``benchmarks/accuracy.py``).

Why the CPU, and what differs from a GPU:

- FakeTensorMode can create fake ``cuda`` tensors in a CPU-only build, but the first autograd node
  aborts the process (``InputMetadata`` asks the CUDA device guard for a stream), so the step runs
  on fake ``cpu`` tensors.
- SDPA: the CPU picks its flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) where CUDA
  picks flash, cuDNN or the memory-efficient kernel: each saves q, k, v, the output and an fp32
  log-sum-exp. Where CUDA runs the math kernel (fp32 with grouped-query attention), the simulation
  runs the same composite (``cuda_kernels.cuda_sdpa``). Attention dropout would send the CPU to the
  math kernel, so it is set to 0 (``model.simulation_config``).
- Dropout: the CPU saves a noise tensor in the input's dtype, CUDA's fused kernel a bool mask;
  the simulation runs the fused op (``torch.native_dropout``) as CUDA does.
- Autocast's fp32 list differs: CUDA runs ``pow``, ``softmax``, ``layer_norm``, ``exp``... in fp32,
  the CPU does not. ``autocast.cuda_fp32_policy`` gives CPU autocast CUDA's fp32 policy during the simulation.
- Two gradients meeting at one node (a tied embedding's, from the head and from the embedding; the
  residual stream's branches) are summed out of place: autograd adds in place into the first only
  for a plain tensor it holds the last reference to (torch/csrc/autograd/input_buffer.cpp
  ``can_accumulate_inplace``), and a fake tensor is a tensor subclass (a real tensor sums out of place
  too while the memory tracker, a dispatch mode, is active). ``cuda_kernels.cuda_grad_accumulation``
  applies the GPU's rule to a parameter's own buffer: a tied head under autocast, whose gradient is
  the cast node's fresh fp32 copy, receives the embedding's in place (without autocast it is a
  transposed view, summed out of place on a GPU as well). For a tied Qwen2.5-0.5B under bf16-mixed
  DDP (micro-batch 1, seq 256, fused AdamW) the embedding's backward is the peak; summed out of place
  it held one fp32 vocabulary-sized tensor, 4 x 151,936 x 896 = 544,538,624 bytes, above the H100's
  (benchmarks/results/gpu_stacks.md; the estimate follows the GPU:
  ``strategy_buffers._replicated_backward_end``). The residual stream's sums stay out of place.
- DDP's communication buckets are allocated outside the measured step and its ``model.to`` cannot
  swap fake parameters, so under ``ddp`` the plain model (under autocast) runs the step and DDP's
  buckets (one copy of the trainable gradients, ``gradient_as_bucket_view=False``) are added to
  ``temporary`` by arithmetic; ``notes`` says so. One rank runs the plain model (``wrappers.recipe``
  applies no DDP to a one-rank group, as accelerate and Lightning do not): no buckets.

The stand-ins themselves are in ``advisor.simulate.fake_env``, the tracker's reading in
``advisor.simulate.measure``, building the model and its optimizer in ``advisor.simulate.model``.

Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from advisor.estimate.accumulation import accumulates_unsharded, accumulation_steps
from advisor.simulate.cuda_kernels import cuda_softmax_backward
from advisor.simulate.fake_env import (cuda_autocast_policy, cuda_dropout, cuda_kernels, fake_mode,
                                       fake_process_group, mesh_outside_fake_mode, unpacked_batches)
from advisor.simulate.measure import (ModulePeak, breakdown, build_tracker, dora_weight_unhooked, live_bytes,
                                      peak_total, skip_frozen_grad_hooks, top_modules)
from advisor.simulate.model import (SIMULATED_OPTIMIZERS, build_optimizer, freeze_to, materialize, meta_model,
                                    net_vocab, resolve_config, training_dtypes, unique_params)
from advisor.simulate.timeline import Timeline
from advisor.strategies import STRATEGIES, Implementation, get_strategy
from advisor.training import TrainingConfig
Phase = Literal["forward", "backward", "optimizer_step"]


def not_simulated(impl: Implementation) -> str | None:
    """Why the simulator cannot run a torch implementation, from its fields; None when it can.

    It runs one rank of a multi-process job, replicated (DDP) or with FSDP2-sharded parameters.
    """
    if impl.single_process:
        return "DataParallel drives several CUDA GPUs from one process, which a CPU cannot stand in for"
    if impl.offloads:
        return "offload moves state from the GPU to the CPU, and the simulated step already runs on the CPU"
    if impl.shard_optimizer and not impl.shard_params:
        return "ZeroRedundancyOptimizer's partitioned step is not measured"
    return None


# Derived from the strategy table: the strategies whose torch implementation the simulator runs.
SIMULATED_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if not_simulated(s.on("torch")) is None)
Progress = Callable[[str], None]
STAGES = ("build", "wrap", "warm-up step", "measured step")


class SimulatedStep(BaseModel):
    """One rank's peak during the measured step, split like ``MemoryBreakdown``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    strategy: str
    world_size: int
    micro_batch_size: int
    seq_len: int
    precision: str
    optimizer_name: str = Field(description="adamw, adam, sgd or sgd-momentum.")
    optimizer_impl: str = Field(default="foreach", description="fused, foreach or for-loop: the torch.optim flag run.")
    checkpointing: bool
    tensors: Literal["fake", "real"] = Field(description="Fake tensors (no memory) or real ones.")
    device: str = Field(description="Where the step ran (cpu: see module docstring).")
    total_params: int
    trainable_params: int
    params: int = Field(description="Parameters (sharded ones under FSDP) and buffers.")
    grads: int = Field(description="Gradients the optimizer reads.")
    optimizer: int = Field(description="Optimizer state.")
    activations: int = Field(description="Forward tensors: saved activations, logits, inputs, autocast copies.")
    temporary: int = Field(description="Backward temporaries, all-gather / reduce-scatter buffers, "
                                       "unsharded FSDP parameters and gradients, DDP buckets.")
    peak_phase: Phase
    top_modules: tuple[ModulePeak, ...]
    notes: tuple[str, ...]
    wall_s: float
    timeline: Timeline | None = Field(default=None, description="Memory segment by segment (simulate(timeline=True)).")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_allocated(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.temporary


def simulate(
    model: str | dict,
    *,
    world_size: int,
    strategy: str,
    training: TrainingConfig,
    micro_batch_size: int,
    checkpointing: bool,
    trainable_params: int | None = None,
    real_tensors: bool = False,
    progress: Progress | None = None,
    timeline: bool = False,
) -> SimulatedStep:
    """Measure one steady-state training step of ``model`` on one of ``world_size`` ranks.

    ``model``: a bundled id, local directory / config.json, Hub id or config dict.
    ``real_tensors``: run with real CPU tensors instead of fake ones (small models; validation).
    ``progress`` is called with each stage's name (``STAGES``) as it starts.
    ``timeline``: also record memory segment by segment (``advisor.simulate.timeline``).
    """
    impl = check_simulated(strategy, training, world_size)
    import torch

    from advisor.simulate.heads import task_targets
    from advisor.simulate.profile import quiet_transformers  # the model's own log warnings are not the step's

    tell = progress or (lambda stage: None)
    start = time.perf_counter()
    name, cfg = resolve_config(model)
    fake = contextlib.nullcontext() if real_tensors else fake_mode()
    tell("build")
    meta = meta_model(cfg, training)
    with fake_process_group(world_size), fake, cuda_autocast_policy(training), unpacked_batches(), \
            cuda_dropout(), cuda_kernels(), dora_weight_unhooked(), quiet_transformers():
        net, trainable = _build(meta, training, trainable_params, real=real_tensors)
        tell("wrap")
        net, opt, notes = _wrap(net, strategy, impl, training, checkpointing)
        if training.optimizer_in_backward:  # torchtune's register_optim_in_bwd_hooks (advisor.estimate.in_backward)
            _step_in_backward(net, opt)
        ids = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.seq_len))
        labels = ids  # an encoder-decoder's decoder reads its own length (--target-len)
        if training.target_len and getattr(meta.config, "is_encoder_decoder", False):
            labels = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.target_len))
        micro_steps = accumulation_steps(training, dp_world=world_size, micro_batch_size=micro_batch_size)
        step = _Step(net, opt, ids, training, impl, labels=task_targets(meta, ids, labels), micro_steps=micro_steps)
        tell("warm-up step")
        step(None)
        tell("measured step")
        tracker = build_tracker(net, opt, ids, impl)
        phases: dict[str, int] = {}
        recorder = _recorder(net, tracker, impl, world_size) if timeline else None
        floor = None  # accumulating: the peak before the last micro-batch (the phases are read from that one)
        with tracker, recorder.watch(tracker) if recorder else contextlib.nullcontext(), cuda_softmax_backward():
            skip_frozen_grad_hooks(tracker, net)
            for i in range(micro_steps - 1):  # every micro-batch inside the tracker: what they hold is tracked
                step.micro(i)
                floor = peak_total(tracker)
                tracker.reset_mod_stats()  # per-module stats of one pass at a time (FSDPMemTracker needs it); peaks stay
            measured_mark = lambda phase: _mark(phase, phases, tracker, recorder)  # noqa: E731
            step.micro(micro_steps - 1, measured_mark)
            step.finish(measured_mark)
        measured = breakdown(tracker)
        top = top_modules(tracker)
    if not impl.shard_params and world_size > 1:  # replicated: DDP's buckets, see the module docstring
        buckets = _ddp_bucket_bytes(net)
        measured["temporary"] += buckets
        notes.append(f"DDP buckets added by arithmetic: {buckets:,} bytes (one copy of the trainable "
                     "gradients; gradient_as_bucket_view=False); the step ran on the plain model")
    return SimulatedStep(
        model=name, strategy=strategy, world_size=world_size, micro_batch_size=micro_batch_size,
        seq_len=training.seq_len, precision=training.precision, optimizer_name=training.optimizer,
        optimizer_impl=training.optimizer_implementation,
        checkpointing=checkpointing, tensors="real" if real_tensors else "fake", device="cpu",
        total_params=sum(p.numel() for p in unique_params(net)), trainable_params=trainable,
        **measured, peak_phase=_phase(phases, floor=floor), top_modules=top, notes=tuple(notes),
        wall_s=round(time.perf_counter() - start, 3), timeline=recorder.timeline() if recorder else None,
    )


def check_simulated(strategy: str, training: TrainingConfig, world_size: int) -> Implementation:
    """The strategy's torch implementation, or ``ValueError`` for what the simulator cannot run."""
    impl = get_strategy(strategy).on("torch")
    why = not_simulated(impl)
    if why is not None:
        raise ValueError(f"'{strategy}' is not simulated yet: {why}")
    if training.engine != "torch":
        raise ValueError("simulate runs the torch engine only (--engine torch)")
    if training.optimizer not in SIMULATED_OPTIMIZERS:
        raise ValueError(f"simulate runs {', '.join(SIMULATED_OPTIMIZERS)}, not '{training.optimizer}'")
    if world_size < 1:
        raise ValueError("world size must be at least 1")
    return impl


def _build(net: Any, training: TrainingConfig, trainable_params: int | None, *, real: bool) -> tuple[Any, int]:
    # Pure bf16 casts the model first (apply_recipe's ``model.to``); fake parameters cannot be
    # swapped in place, so they are made in bf16 and the recipe's cast is a no-op (see _wrap).
    # A LoRA base held in the compute dtype (the recipe's frozen_base, TrainingConfig.low_precision_base):
    # frozen weights in bf16, PEFT's adapters in fp32 (autocast_adapter_dtype); so too under pure bf16 where the
    # stack never casts the model (TrainingConfig.fp32_adapters), with no autocast. training_dtypes says which.
    dtype, frozen = training_dtypes(training)
    materialize(net, device="cpu", real=real, dtype=dtype, frozen_dtype=frozen)
    trainable = freeze_to(net, None if training.lora is not None else trainable_params)
    if trainable == 0:
        raise ValueError("no parameter would train: raise --trainable-params")
    net.train()
    return net, trainable


def _wrap(net: Any, strategy: str, impl: Implementation, training: TrainingConfig,
          checkpointing: bool) -> tuple[Any, Any, list[str]]:
    """Apply the recipe ``wrap()`` applies; replicated (DDP), only its model-side steps (see docstring).
    ``training.keeps_kv_cache``: the blocks are checkpointed as torch's ``checkpoint_wrapper`` does, leaving the
    model's KV cache on (``wrap()`` turns it off; Lightning's and accelerate's FSDP checkpointing do not)."""
    if not training.keeps_kv_cache:
        return _wrap_as_wrap_does(net, strategy, impl, training, checkpointing)
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="activation checkpointing: setting model.config.use_cache")
        net, opt, notes = _wrap_as_wrap_does(net, strategy, impl, training, checkpointing)
    _model_config(net).use_cache = True
    notes.append("KV cache on in training (config.use_cache=True under torch's checkpoint_wrapper)")
    return net, opt, notes


def _wrap_as_wrap_does(net: Any, strategy: str, impl: Implementation, training: TrainingConfig,
                       checkpointing: bool) -> tuple[Any, Any, list[str]]:
    """The model-side steps of ``wrap()``, then ``--activation-offload``'s hooks (their shape-keeping form:
    ``wrappers.activation_offload``)."""
    net, opt, notes = _wrap_recipe(net, strategy, impl, training, checkpointing)
    if training.activation_offload:
        from wrappers.activation_offload import apply_activation_offload

        apply_activation_offload(net, host=False)
        notes.append("activation offloading: the body's saved tensors of 1 KiB or more made again in backward "
                     "(wrappers.activation_offload, host=False)")
    return net, opt, notes


def _wrap_recipe(net: Any, strategy: str, impl: Implementation, training: TrainingConfig,
                 checkpointing: bool) -> tuple[Any, Any, list[str]]:
    from wrappers.recipe import Recipe, apply_recipe

    opt = build_optimizer([p for p in unique_params(net) if p.requires_grad], training)
    notes: list[str] = []
    if not impl.shard_params:
        from wrappers.blocks import find_blocks
        from wrappers.checkpointing import apply_activation_checkpointing
        if checkpointing:
            apply_activation_checkpointing(net, blocks=find_blocks(net),
                                           selective=training.activation_checkpointing == "selective")
        return net, opt, notes
    mode = ("selective" if training.activation_checkpointing == "selective" else "on") if checkpointing else "off"
    recipe = Recipe(strategy=strategy, precision=training.precision, checkpointing=mode,
                    shard_experts_on_dim1=training.recipe.shard_experts_on_dim1,
                    reduce_in_compute_dtype=training.recipe.fsdp_reduce_dtype == "compute",
                    # an older torch's root, unsharded from its forward to its backward (library_releases.json),
                    # or a stack's that asks for that (Recipe.fsdp_root_reshards)
                    root_reshard_after_forward=None if training.fsdp_root_regathered else False,
                    outer_units=training.recipe.fsdp_outer_units and training.loss != "fused",
                    cast_model=not training.fp32_adapters)
    applied = apply_recipe(net, recipe, device="cpu", optimizer=opt, mesh=mesh_outside_fake_mode())
    return applied.model, applied.optimizer, notes


def _model_config(net: Any) -> Any:
    """The Hugging Face config of ``net`` (a PEFT model's base model's)."""
    return next(m.config for m in net.modules() if hasattr(m, "config") and hasattr(m.config, "use_cache"))


class _Step:
    """One training step of ``--global-batch`` / (micro-batch x ranks) micro-batches (``accumulation_steps``):
    forward (+ loss) and backward of each, then the optimizer step and zero_grad(set_to_none=True) (False where
    the run's torch is before 2.0, whose zero_grad() kept the gradients as zeros). A recipe
    whose loop frees the gradients only before the backward (``zero_grad: before_backward``, Lightning's
    closure) frees them before the first backward instead, so the previous step's live through that forward.
    Under FSDP2, a recipe that syncs only the last micro-batch (``accumulation_sync``: accelerate's no_sync)
    switches FSDP's gradient sync off for the others (``set_requires_gradient_sync``)."""

    def __init__(self, net: Any, opt: Any, ids: Any, training: TrainingConfig, impl: Implementation, *,
                 labels: Any = None, micro_steps: int = 1) -> None:
        self.net, self.opt, self.ids, self.training, self.impl = net, opt, ids, training, impl
        self.labels, self.micro_steps = labels, micro_steps
        self.late_zero_grad = training.recipe.zero_grad == "before_backward"
        self.to_none = not training.grads_kept_as_zeros  # torch < 2.0's zero_grad() kept them, as zeros
        self.sync_last = micro_steps > 1 and accumulates_unsharded(training, impl)

    def micro(self, i: int, mark: Callable[[str], None] | None = None) -> None:
        """Forward and backward of micro-batch ``i``."""
        from wrappers.recipe import autocast_context

        mark = mark or (lambda phase: None)
        if self.sync_last:
            self.net.set_requires_gradient_sync(i == self.micro_steps - 1)
        # FSDP2 casts through its MixedPrecisionPolicy; DDP and the plain model run under autocast. Accelerate runs
        # autocast under FSDP2 too, which only TRL's chunked_nll reads (its fp32 copies of the bf16 head are cast back
        # for the matmul: advisor.estimate.activations_loss.chunked_nll_bytes): there the step runs it.
        sharded = self.impl.shard_params and not self.training.chunked_nll
        cast = contextlib.nullcontext() if sharded else autocast_context(
            self.training.precision, "cpu", cache_enabled=self.training.recipe.autocast_cache)
        with cast:
            labels = self.labels
            targets = labels if isinstance(labels, dict) else {"labels": self.ids if labels is None else labels}
            loss = self.net(input_ids=self.ids, **targets).loss  # a task head's targets: advisor.simulate.heads
        mark("forward")
        if self.late_zero_grad and i == 0:
            self.opt.zero_grad(set_to_none=self.to_none)
        loss.backward()
        del loss
        mark("backward")

    def finish(self, mark: Callable[[str], None] | None = None) -> None:
        """The optimizer step (else each parameter stepped in its hook: ``_step_in_backward``) and zero_grad."""
        mark = mark or (lambda phase: None)
        if not self.training.optimizer_in_backward:
            self.opt.step()
        if not self.late_zero_grad:
            self.opt.zero_grad(set_to_none=self.to_none)
        mark("optimizer_step")

    def __call__(self, mark: Callable[[str], None] | None = None) -> None:
        for i in range(self.micro_steps):
            self.micro(i, mark)
        self.finish(mark)


def _step_in_backward(net: Any, opt: Any) -> None:
    """Step each parameter in its post-accumulate-grad hook and free its gradient, as torchtune's
    ``register_optim_in_bwd_hooks`` does (one optimizer per parameter there; here one optimizer whose step
    finds only this parameter's gradient, every other one freed already: the same kernels over one tensor)."""
    def step_one(param: Any) -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    for param in unique_params(net):
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(step_one)


def _recorder(net: Any, tracker: Any, impl: Implementation, world_size: int) -> Any:
    """A timeline recorder reading the tracker's live bytes by category; under DDP the buckets (added to
    ``temporary`` by arithmetic, see the module docstring) are live throughout the step."""
    from advisor.simulate.timeline import CategoryBytes, TimelineRecorder, segment_stops
    from wrappers.blocks import find_blocks

    buckets = 0 if impl.shard_params or world_size == 1 else _ddp_bucket_bytes(net)
    return TimelineRecorder(lambda: live_bytes(tracker), segment_stops(net, find_blocks(net)),
                            extra=CategoryBytes(temporary=buckets))


def _ddp_bucket_bytes(net: Any) -> int:
    return sum(p.numel() * p.element_size() for p in unique_params(net) if p.requires_grad)


def _mark(phase: str, phases: dict[str, int], tracker: Any, recorder: Any) -> None:
    phases[phase] = peak_total(tracker)
    if recorder is not None:
        recorder.mark(phase)


def _phase(marks: dict[str, int], *, floor: int | None = None) -> Phase:
    """The phase during which the peak last rose (the tracker's peak is read after each phase). ``floor``: the
    peak the earlier micro-batches of an accumulating step reached; where the last one never passes it, the
    peak was an earlier backward."""
    order: tuple[Phase, ...] = ("forward", "backward", "optimizer_step")
    if floor is not None and max(marks.values(), default=0) <= floor:
        return "backward"
    winner: Phase = "forward"
    previous = floor or 0
    for phase in order:
        if marks.get(phase, 0) > previous:
            winner, previous = phase, marks[phase]
    return winner
