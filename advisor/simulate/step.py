"""Run one real training step in PyTorch, without a GPU, and measure each rank's peak memory.

``simulate(model, world_size=, strategy=, training=, micro_batch_size=, checkpointing=)`` builds
the model from its config on the meta device, gives it fake tensors (``FakeTensorMode``: shapes and
dtypes, no storage), applies the same wrapping ``wrap()`` applies (``wrappers.recipe``), and runs
two steps (forward, backward, ``optimizer.step()``, ``zero_grad``) under a fake process group of
the target world size (``torch.testing._internal.distributed.fake_pg``). The second step is
measured by PyTorch's own tracker (``torch.distributed._tools.mem_tracker.MemTracker``, or
``fsdp2_mem_tracker.FSDPMemTracker`` under FSDP2), which counts every tensor storage the step
creates, categorised. It is the analytic model's ground truth (``benchmarks/accuracy.py``).

Why the CPU, and what differs from a GPU:

- FakeTensorMode can create fake ``cuda`` tensors in a CPU-only build, but the first autograd node
  aborts the process (``InputMetadata`` asks the CUDA device guard for a stream), so the step runs
  on fake ``cpu`` tensors.
- SDPA: the CPU picks its flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) as CUDA
  picks flash: it saves q, k, v, the output and an fp32 log-sum-exp, natively for GQA. Attention
  dropout would send the CPU to the math kernel, so it is set to 0 (``sim_model``).
- Dropout: the CPU saves a noise tensor in the input's dtype, CUDA's fused kernel a bool mask;
  the simulation runs the fused op (``torch.native_dropout``) as CUDA does.
- Autocast's fp32 list differs: CUDA runs ``pow``, ``softmax``, ``layer_norm``, ``exp``... in fp32,
  the CPU does not. ``sim_autocast`` gives CPU autocast CUDA's fp32 policy during the simulation.
- Two gradients meeting at one node (a tied embedding's, from the head and from the embedding; the
  residual stream's branches) are summed out of place: autograd adds in place into the first only
  for a plain tensor it holds the last reference to (torch/csrc/autograd/input_buffer.cpp
  ``can_accumulate_inplace``), and a fake tensor is a tensor subclass (so is a real tensor the memory
  tracker has seen: it sums out of place too). Where a GPU's first gradient qualifies, the GPU holds one
  such gradient less: a tied head under autocast, whose gradient is the cast node's fresh fp32 copy
  (without autocast it is a transposed view, summed out of place on a GPU as well). For a tied
  Qwen2.5-0.5B under bf16-mixed DDP (micro-batch 1, seq 256, fused AdamW) the embedding's backward is
  the peak and the simulated step is one fp32 vocabulary-sized tensor, 4 x 151,936 x 896 = 544,538,624
  bytes, above the H100's (benchmarks/results/gpu_stacks.md; the estimate follows the GPU:
  ``strategy_buffers._replicated_backward_end``).
- DDP's communication buckets are allocated outside the measured step and its ``model.to`` cannot
  swap fake parameters, so under ``ddp`` the plain model (under autocast) runs the step and DDP's
  buckets (one copy of the trainable gradients, ``gradient_as_bucket_view=False``) are added to
  ``temporary`` by arithmetic; ``notes`` says so. One rank runs the plain model (``wrappers.recipe``
  applies no DDP to a one-rank group, as accelerate and Lightning do not): no buckets.

Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

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
    if impl.offload_params or impl.offload_optimizer:
        return "offload moves state from the GPU to the CPU, and the simulated step already runs on the CPU"
    if impl.shard_optimizer and not impl.shard_params:
        return "ZeroRedundancyOptimizer's partitioned step is not measured"
    return None


# Derived from the strategy table: the strategies whose torch implementation the simulator runs.
SIMULATED_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if not_simulated(s.on("torch")) is None)
Progress = Callable[[str], None]
STAGES = ("build", "wrap", "warm-up step", "measured step")


class ModulePeak(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Module path in the model.")
    phase: Literal["forward", "backward"] = Field(description="When its peak happened.")
    peak_bytes: int = Field(description="All live memory at the module's own peak.")


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


# Tracker categories (``_MemRefType`` / ``_FSDPRefType`` values) -> our breakdown.
_CATEGORY = {
    "Parameter": "params", "Sharded Param": "params", "Buffer": "params",
    "Gradient": "grads", "Sharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Inputs": "activations", "Other": "activations",
    "Temp": "temporary", "Unsharded Param": "temporary", "Unsharded Grad": "temporary",
    "All Gather": "temporary", "Reduce Scatter": "temporary",
}


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
    impl = _check(strategy, training, world_size)
    import torch

    from advisor.simulate.heads import task_targets
    from advisor.simulate.model import resolve_config

    tell = progress or (lambda stage: None)
    start = time.perf_counter()
    name, cfg = resolve_config(model)
    fake = contextlib.nullcontext() if real_tensors else _fake_mode()
    tell("build")
    meta = _meta_model(cfg, training)
    with _fake_process_group(world_size), fake, _cuda_autocast_policy(training), _unpacked_batches(), \
            cuda_dropout():
        net, trainable = _build(meta, training, trainable_params, real=real_tensors)
        tell("wrap")
        net, opt, notes = _wrap(net, strategy, impl, training, checkpointing)
        ids = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.seq_len))
        labels = ids  # an encoder-decoder's decoder reads its own length (--target-len)
        if training.target_len and getattr(meta.config, "is_encoder_decoder", False):
            labels = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.target_len))
        step = _step_fn(net, opt, ids, training, impl, labels=task_targets(meta, ids, labels))
        tell("warm-up step")
        step(None)
        tell("measured step")
        tracker = _tracker(net, opt, ids, impl)
        phases: dict[str, int] = {}
        recorder = _recorder(net, tracker, impl, world_size) if timeline else None
        with tracker, recorder.watch(tracker) if recorder else contextlib.nullcontext():
            _no_grad_hooks_on_frozen(tracker, net)
            step(lambda phase: _mark(phase, phases, tracker, recorder))
        measured = _breakdown(tracker)
        top = _top_modules(tracker)
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
        total_params=sum(p.numel() for p in _unique_params(net)), trainable_params=trainable,
        **measured, peak_phase=_phase(phases), top_modules=top, notes=tuple(notes),
        wall_s=round(time.perf_counter() - start, 3), timeline=recorder.timeline() if recorder else None,
    )


def net_vocab(cfg: dict) -> int:
    return cfg.get("vocab_size") or 1000


def _check(strategy: str, training: TrainingConfig, world_size: int) -> Implementation:
    """The strategy's torch implementation, or ``ValueError`` for what the simulator cannot run."""
    impl = get_strategy(strategy).on("torch")
    why = not_simulated(impl)
    if why is not None:
        raise ValueError(f"'{strategy}' is not simulated yet: {why}")
    if training.engine != "torch":
        raise ValueError("simulate runs the torch engine only (--engine torch)")
    if training.optimizer not in ("adamw", "adam", "sgd", "sgd-momentum"):
        raise ValueError(f"simulate runs adamw, adam, sgd and sgd-momentum, not '{training.optimizer}'")
    if world_size < 1:
        raise ValueError("world size must be at least 1")
    return impl


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@contextlib.contextmanager
def _fake_process_group(world_size: int):
    """A fake default process group of ``world_size`` ranks (this process is rank 0)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError("simulate needs its own (fake) process group; a process group is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _cuda_autocast_policy(training: TrainingConfig) -> Any:
    from advisor.simulate.autocast import cuda_fp32_policy

    return cuda_fp32_policy() if training.mixed else contextlib.nullcontext()


@contextlib.contextmanager
def cuda_dropout():
    """On CUDA, ``F.dropout`` in training runs the fused ``native_dropout`` and saves a bool mask
    (aten/src/ATen/native/Dropout.cpp ``is_fused_kernel_acceptable``); on the CPU it multiplies by a
    noise tensor in the input's dtype and saves that. Run CUDA's op (it has a CPU kernel)."""
    import torch
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0 or inplace:
            return original(input, p, training, inplace)
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


@contextlib.contextmanager
def _unpacked_batches():
    """Hugging Face looks for packed sequences in ``position_ids`` (``masking_utils.
    find_packed_sequence_indices``) and, unable to read a fake tensor's values, assumes packing and
    builds an s x s mask, which sends SDPA to another kernel. Our batches hold one sequence per row,
    for which a real run finds none: say so without reading values."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def _meta_model(cfg: dict, training: TrainingConfig) -> Any:
    """The model on the meta device, with PEFT's adapters when LoRA is asked for. Built outside the
    fake mode: PEFT creates each adapter on the CPU and moves it to its base layer's device, a swap
    that fake mode refuses."""
    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import simulation_config

    from wrappers.losses import use_loss_kernel

    net = build_meta_model(simulation_config(cfg, attention=training.attention))
    use_loss_kernel(net, training.loss)  # before PEFT: the adapters wrap the model, not its forward
    return net if training.lora is None else _with_lora(net, cfg, training.lora)


def _build(net: Any, training: TrainingConfig, trainable_params: int | None, *, real: bool) -> tuple[Any, int]:
    from advisor.simulate.model import freeze_to, materialize

    import torch

    # Pure bf16 casts the model first (apply_recipe's ``model.to``); fake parameters cannot be
    # swapped in place, so they are made in bf16 and the recipe's cast is a no-op (see _wrap).
    # A LoRA base held in the compute dtype (the recipe's frozen_base, TrainingConfig.low_precision_base):
    # frozen weights in bf16, PEFT's adapters in fp32 (autocast_adapter_dtype).
    frozen = getattr(torch, training.precision_info.compute_dtype) if training.low_precision_base else None
    materialize(net, device="cpu", real=real, dtype=torch.bfloat16 if training.precision == "bf16" else None,
                frozen_dtype=frozen)
    trainable = freeze_to(net, None if training.lora is not None else trainable_params)
    if trainable == 0:
        raise ValueError("no parameter would train: raise --trainable-params")
    net.train()
    return net, trainable


def _with_lora(net: Any, cfg: dict, lora: Any) -> Any:
    """PEFT's own adapters on the meta-device model (PEFT freezes the base); the PeftModel's inner
    model is returned, which is what a training script's forward runs."""
    try:
        import peft
    except ImportError:
        raise ValueError("simulating --lora needs PEFT: pip install peft") from None
    from advisor.model.lora import default_targets
    from advisor.model.sources import spec_from_config

    spec = spec_from_config(cfg, name=str(cfg.get("_name_or_path", "model")), source="local")
    wrapped = peft.get_peft_model(net, peft.LoraConfig(**lora.peft_kwargs(
        () if lora.targets else default_targets(spec))))
    return wrapped.base_model.model


# torch.optim's flags for each implementation (torch/optim/adam.py: fused=True runs _fused_adam,
# foreach=True _multi_tensor_adam, foreach=False _single_tensor_adam).
_IMPL_FLAGS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}


def _optimizer(net: Any, training: TrainingConfig) -> Any:
    """The recipe's optimizer in its implementation (``training.optimizer_implementation``), as on a GPU."""
    import torch

    params = [p for p in _unique_params(net) if p.requires_grad]
    flags = _IMPL_FLAGS[training.optimizer_implementation]
    if training.optimizer in ("adamw", "adam"):
        cls = torch.optim.AdamW if training.optimizer == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-4, **flags)
    momentum = 0.9 if training.optimizer == "sgd-momentum" else 0.0
    return torch.optim.SGD(params, lr=1e-4, momentum=momentum, **flags)


def _wrap(net: Any, strategy: str, impl: Implementation, training: TrainingConfig,
          checkpointing: bool) -> tuple[Any, Any, list[str]]:
    """Apply the recipe ``wrap()`` applies; replicated (DDP), only its model-side steps (see docstring)."""
    from wrappers.recipe import Recipe, apply_recipe

    opt = _optimizer(net, training)
    notes: list[str] = []
    if not impl.shard_params:
        from wrappers.blocks import find_blocks
        from wrappers.checkpointing import apply_activation_checkpointing
        if checkpointing:
            apply_activation_checkpointing(net, blocks=find_blocks(net),
                                           selective=training.activation_checkpointing == "selective")
        return net, opt, notes
    recipe = Recipe(strategy=strategy, precision=training.precision, activation_checkpointing=checkpointing,
                    selective_checkpointing=checkpointing and training.activation_checkpointing == "selective")
    applied = apply_recipe(net, recipe, device="cpu", optimizer=opt, mesh=_mesh_outside_fake_mode())
    return applied.model, applied.optimizer, notes


def _mesh_outside_fake_mode() -> Any:
    """``DeviceMesh`` reads its rank list back with ``tolist()``, which a fake tensor cannot do: build
    the mesh outside the fake mode (it holds a few integers) and hand it to ``apply_recipe``."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    with unset_fake_temporarily():
        return DeviceMesh.from_group(dist.group.WORLD, device_type="cpu")


def _step_fn(net: Any, opt: Any, ids: Any, training: TrainingConfig, impl: Implementation, *,
             labels: Any = None) -> Callable:
    """forward (+ loss), backward, optimizer step, zero_grad(set_to_none=True)."""
    from wrappers.recipe import autocast_context

    def step(mark: Callable[[str], None] | None) -> None:
        mark = mark or (lambda phase: None)
        # FSDP2 casts through its MixedPrecisionPolicy; DDP and the plain model run under autocast.
        cast = contextlib.nullcontext() if impl.shard_params else autocast_context(training.precision, "cpu")
        with cast:
            targets = labels if isinstance(labels, dict) else {"labels": ids if labels is None else labels}
            loss = net(input_ids=ids, **targets).loss  # a task head's targets: advisor.simulate.heads
        mark("forward")
        loss.backward()
        del loss
        mark("backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark("optimizer_step")

    return step


def _tracker(net: Any, opt: Any, ids: Any, impl: Implementation) -> Any:
    if not impl.shard_params:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(net, opt, ids)
        return tracker
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker = FSDPMemTracker(net, opt)
    tracker.track_inputs((ids,))
    return tracker


class _NoHook:
    def remove(self) -> None:
        pass


def _no_grad_hooks_on_frozen(tracker: Any, net: Any) -> None:
    """``MemTracker`` (torch 2.13) registers a gradient hook on every parameter of a module it enters,
    which raises for a frozen one (LoRA, ``--trainable-params``). Marking the frozen ones as already
    hooked (with handles whose ``remove`` does nothing) makes it skip them; they get no gradient."""
    handles = getattr(tracker, "_param_to_grad_hook_handles", None)
    if handles is None:
        return
    for param in _unique_params(net):
        if not param.requires_grad:
            handles[param] = (_NoHook(), _NoHook())


def _recorder(net: Any, tracker: Any, impl: Implementation, world_size: int) -> Any:
    """A timeline recorder reading the tracker's live bytes by category; under DDP the buckets (added to
    ``temporary`` by arithmetic, see the module docstring) are live throughout the step."""
    from advisor.simulate.timeline import CategoryBytes, TimelineRecorder, segment_stops
    from wrappers.blocks import find_blocks

    buckets = 0 if impl.shard_params or world_size == 1 else _ddp_bucket_bytes(net)
    return TimelineRecorder(lambda: _live(tracker), segment_stops(net, find_blocks(net)),
                            extra=CategoryBytes(temporary=buckets))


def _ddp_bucket_bytes(net: Any) -> int:
    return sum(p.numel() * p.element_size() for p in _unique_params(net) if p.requires_grad)


def _mark(phase: str, phases: dict[str, int], tracker: Any, recorder: Any) -> None:
    phases[phase] = _peak_total(tracker)
    if recorder is not None:
        recorder.mark(phase)


def _live(tracker: Any) -> dict[str, int]:
    return _by_category(tracker.get_tracker_snapshot("current"))


def _peak_total(tracker: Any) -> int:
    return sum(snap.get("Total", 0) for snap in tracker.get_tracker_snapshot("peak").values())


def _phase(marks: dict[str, int]) -> Phase:
    """The phase during which the peak last rose (the tracker's peak is read after each phase)."""
    order: tuple[Phase, ...] = ("forward", "backward", "optimizer_step")
    winner: Phase = "forward"
    previous = 0
    for phase in order:
        if marks.get(phase, 0) > previous:
            winner, previous = phase, marks[phase]
    return winner


def _breakdown(tracker: Any) -> dict[str, int]:
    return _by_category(tracker.get_tracker_snapshot("peak"))


def _by_category(snapshot: dict) -> dict[str, int]:
    out = dict.fromkeys(("params", "grads", "optimizer", "activations", "temporary"), 0)
    for snap in snapshot.values():
        for key, value in snap.items():
            if key != "Total":
                out[_CATEGORY[str(getattr(key, "value", key))]] += value
    return out


def _top_modules(tracker: Any, count: int = 5) -> tuple[ModulePeak, ...]:
    """Modules below the root with the highest memory at their own peak."""
    rows = []
    for stats in tracker.memory_tracking.values():
        if "." not in stats.mod_fqn:  # the root holds the global peak by definition
            continue
        for state, phase in (("Peak-Forward", "forward"), ("Peak Forward", "forward"),
                             ("Peak-Backward", "backward"), ("Peak Backward", "backward")):
            for snap in _snapshots(stats, state):
                total = sum(dev.get("Total", 0) for dev in snap.values())
                rows.append(ModulePeak(name=_clean_fqn(stats.mod_fqn), phase=phase, peak_bytes=total))
    rows.sort(key=lambda r: (-r.peak_bytes, r.name))
    seen: set[str] = set()
    top = []
    for row in rows:
        if row.name not in seen:
            seen.add(row.name)
            top.append(row)
    return tuple(top[:count])


def _snapshots(stats: Any, state_value: str) -> list:
    return next((snaps for state, snaps in stats.snapshots.items() if state.value == state_value), [])


def _clean_fqn(fqn: str) -> str:
    return fqn.replace("._checkpoint_wrapped_module", "").removeprefix("Global.")


def _unique_params(net: Any) -> list:
    return list(dict.fromkeys(net.parameters()))
