"""One FSDP1 training step on real CPU tensors and a fake process group: the reference for the FSDP1 estimate
(``advisor.estimate.fsdp1_buffers``).

What belongs here: wrapping the simulated model as accelerate's FSDP1 plugin does
(accelerate/accelerator.py ``prepare_model``: ``FullyShardedDataParallel(model, sharding_strategy=,
auto_wrap_policy=transformer_auto_wrap_policy(blocks), mixed_precision=, backward_prefetch=,
limit_all_gathers=True, use_orig_params=, device_id=)``; the MixedPrecision of
accelerate/utils/dataclasses.py ``FullyShardedDataParallelPlugin.set_mixed_precision``: param, reduce and
buffer dtype all the compute dtype), checkpointing applied after wrapping (accelerate's
``fsdp_activation_checkpointing``: ``apply_activation_checkpointing`` on the blocks inside their FSDP
units), and measuring the second step. What does not: the FSDP2 step (``advisor.simulate.step``).

Measured by ``FlatLiveBytes``, not PyTorch's ``MemTracker``: FSDP1 allocates each unit's unsharded flat
parameter and bf16 shard once, at wrapping, then frees and reallocates them by resizing their storage
(torch/distributed/fsdp/_flat_param.py ``_free_storage``, utils.py ``_alloc_storage``), and under
use_orig_params it swaps each module's parameters for views of the unsharded flat parameter in forward,
on which MemTracker's gradient hooks cannot be registered ("post accumulate grad hooks cannot be registered
on non-leaf tensors").

The step runs without autocast, as the FSDP2 simulation does: FSDP1's MixedPrecision already computes in
bf16 (accelerate also wraps the forward in autocast, which changes only the fp32 op list's outputs). Except a
LoRA model under a recipe that gives the adapters units of their own (``Recipe.adapter_units``: HF Trainer
wraps with PEFT's ``fsdp_auto_wrap_policy`` instead of the block policy): there PEFT casts a layer's input to
lora_A's weight dtype read outside lora_A's unit (its fp32 shard) while the unit computes in bf16, which only
accelerate's autocast reconciles, so that step runs under CPU autocast with CUDA's fp32 op list.
Real tensors, not fake ones: FSDP1 tells storages apart by ``data_ptr()`` (torch/distributed/fsdp/_flat_param.py
``_same_storage``, ``_writeback_orig_params``'s ``_data_ptr_allocated``; _runtime_utils.py ``_reshard``'s
``already_resharded`` check), and every fake tensor's is 0: under FakeTensorMode the second step's pre-backward
fails with "If skipped using sharded views, the unsharded flat parameter should be allocated". So only small
models are simulated (the collectives of the fake process group still move nothing).
Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from typing import Any

from advisor.simulate.cuda_kernels import cuda_softmax_backward
from advisor.simulate.fake_env import (cuda_autocast_policy, cuda_dropout, fake_process_group, kernel_scratch,
                                       unpacked_batches)
from advisor.simulate.measure import DispatchObserver
from advisor.simulate.model import (build_optimizer, freeze_to, materialize, meta_model, net_vocab, resolve_config,
                                   training_dtypes)
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

# Our strategy -> FSDP1's ShardingStrategy (torch/distributed/fsdp/api.py): zero3 FULL_SHARD, zero2
# SHARD_GRAD_OP (parameters kept unsharded from forward to backward).
SHARDING = {"zero3": "FULL_SHARD", "zero2": "SHARD_GRAD_OP"}


def simulate_fsdp1(model: str | dict, *, world_size: int, strategy: str, training: TrainingConfig,
                   micro_batch_size: int, checkpointing: bool) -> dict[str, Any]:
    """One rank's peak of the second step: ``{"peak_allocated", "moments", "phase_peaks", "states", "wall_s"}``
    (moments: the peak within each moment's window, ``_PHASE_ENDS``; phase_peaks: the peak of the forward (with
    the loss), the backward and the optimizer step; states: the sharded parameters and the optimizer state at the
    start of the step)."""
    import torch

    if strategy not in SHARDING:
        raise ValueError(f"FSDP1 simulates {', '.join(SHARDING)}, not '{strategy}'")
    if get_strategy(strategy).on("torch").offload_params:
        raise ValueError("offload is not simulated")
    start = time.perf_counter()
    _, cfg = resolve_config(model)
    meta = meta_model(cfg, training)
    # Real tensors (see the module docstring: FSDP1 compares storages by data_ptr, 0 for every fake tensor).
    with fake_process_group(world_size), unpacked_batches(), cuda_dropout(), kernel_scratch(), \
            cuda_autocast_policy(training):
        dtype, frozen = training_dtypes(training)
        materialize(meta, device="cpu", real=True, dtype=dtype, frozen_dtype=frozen)
        freeze_to(meta, None)
        meta.train()
        net = _wrap_fsdp1(meta, strategy, training, checkpointing)
        opt = build_optimizer([p for p in net.parameters() if p.requires_grad], training)
        ids = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.seq_len))
        # Adapters in units of their own: PEFT casts a LoRA layer's input to lora_A's weight dtype, read outside
        # lora_A's unit (its fp32 shard), while the unit computes in bf16; accelerate's autocast around the forward
        # (accelerate/accelerator.py prepare_model, mixed_precision bf16) reconciles them, so it runs here too.
        cast = None
        if training.lora is not None and training.recipe.adapter_units and training.mixed:
            from wrappers.recipe import autocast_context

            cast = autocast_context(training.precision, "cpu", cache_enabled=training.recipe.autocast_cache)
        _step(net, opt, ids, None, cast)
        counter = FlatLiveBytes([p for p in net.parameters()], opt, resizable=_flat_buffers(net))
        moments: dict[str, int] = {}

        def close(moment: str) -> None:
            moments[moment] = counter.restart()

        hooks = _moment_hooks(net, close)
        with counter, cuda_softmax_backward():
            _step(net, opt, ids, lambda phase: close(_PHASE_ENDS[phase]), cast)
        for hook in hooks:
            hook.remove()
    return {"peak_allocated": max(moments.values()), "phase_peaks": _phase_peaks(moments), "moments": moments,
            "states": counter.states, "wall_s": round(time.perf_counter() - start, 3)}


# The window that ends at each mark is the moment of the estimate (advisor.estimate.memory) it holds:
# step start -> first block's forward: start_of_forward (the root's all-gather); -> end of the loss's forward:
# end_of_forward; -> the head's backward: loss_backward; -> the input embedding's backward: block_backward (the
# head's matmul and the blocks); -> end of backward: end_of_backward; -> end of the step: optimizer_step. A window
# whose closing hook does not fire (a frozen embedding gets no backward) is merged into the next one.
_PHASE_ENDS = {"forward": "end_of_forward", "backward": "end_of_backward", "optimizer_step": "optimizer_step"}
_PHASES = {"forward": ("start_of_forward", "end_of_forward"),
           "backward": ("loss_backward", "block_backward", "end_of_backward"), "optimizer_step": ("optimizer_step",)}


def _phase_peaks(moments: dict[str, int]) -> dict[str, int]:
    return {phase: max(moments[m] for m in names if m in moments) for phase, names in _PHASES.items()}


def _moment_hooks(net: Any, close: Any) -> list:
    from wrappers.blocks import find_blocks

    inner = net.module  # the model FSDP wraps
    first = find_blocks(inner)[0]
    return [first.register_forward_pre_hook(lambda *args: close("start_of_forward")),
            inner.get_output_embeddings().register_full_backward_pre_hook(lambda *args: close("loss_backward")),
            inner.get_input_embeddings().register_full_backward_pre_hook(lambda *args: close("block_backward"))]


def _flat_buffers(net: Any) -> list:
    """Each unit's unsharded (``_full_param_padded``) and low-precision shard (``_mp_shard``) tensors. FSDP1
    allocates their storages once, at wrapping, and then resizes them (utils.py ``_alloc_storage`` /
    ``_free_storage``): counted at their current size (``FlatLiveBytes``)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    out = []
    for unit in FSDP.fsdp_modules(net):
        flat = unit._handle.flat_param if unit._handle is not None else None
        for name in ("_full_param_padded", "_mp_shard", "_full_prec_full_param_padded"):
            if flat is not None and hasattr(flat, name):
                out.append(getattr(flat, name))
    return out


class FlatLiveBytes(DispatchObserver):
    """Live tensor storage bytes after every op (a ``TorchDispatchMode``) and their peak. Storages an op
    creates count their size until Python frees them; FSDP1's resizable ones (``_flat_buffers``) count their
    current size, read at every op, since FSDP1 frees and reallocates them by ``resize_`` (not an op)."""

    def __init__(self, params: list, opt: Any, *, resizable: list) -> None:
        import torch

        self.sizes: dict[int, int] = {}
        self.refs: dict[int, Any] = {}
        self.resizable = {t.untyped_storage()._cdata: t for t in resizable}
        states = [t for state in opt.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
        self.track([*params, *states])
        self.states = sum(self.sizes.values())
        self.peak = self.now()

    def restart(self) -> int:
        """The peak since the last restart; the next one starts from what is live now."""
        peak, self.peak = self.peak, self.now()
        return peak

    def now(self) -> int:
        return sum(self.sizes.values()) + sum(t.untyped_storage().nbytes() for t in self.resizable.values())

    def track(self, tensors: Any) -> None:
        import torch

        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.sizes or key in self.resizable:
                continue
            self.sizes[key] = st.nbytes()
            self.refs[key] = weakref.ref(st, lambda _, key=key: self.sizes.pop(key, None))
        self.peak = max(self.peak, self.now()) if hasattr(self, "peak") else 0

    def observe(self, tensors: list) -> None:
        self.track(tensors)


def _wrap_fsdp1(net: Any, strategy: str, training: TrainingConfig, checkpointing: bool) -> Any:
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                             apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from wrappers.blocks import find_blocks

    kinds = {type(b) for b in find_blocks(net)}
    mixed = None
    if training.mixed:
        dtype = getattr(torch, training.precision_info.compute_dtype)
        mixed = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=kinds)
    if training.lora is not None and training.recipe.adapter_units:
        # HF Trainer's PEFT policy (transformers/distributed/fsdp.py update_fsdp_plugin_peft): every lora_A /
        # lora_B its own unit, or'd with the decoder layers, whose units then hold only the frozen base.
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(net)
    wrapped = FSDP(net, sharding_strategy=ShardingStrategy[SHARDING[strategy]], mixed_precision=mixed,
                   auto_wrap_policy=policy,
                   backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True, use_orig_params=True,
                   device_id=torch.device("cpu"))
    if checkpointing:
        apply_activation_checkpointing(
            wrapped, check_fn=lambda m: type(m) in kinds,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return wrapped


def _step(net: Any, opt: Any, ids: Any, mark: Any, cast: Any = None) -> None:
    mark = mark or (lambda phase: None)
    with cast or contextlib.nullcontext():
        loss = net(input_ids=ids, labels=ids).loss
    mark("forward")
    loss.backward()
    del loss
    mark("backward")
    opt.step()
    opt.zero_grad(set_to_none=True)
    mark("optimizer_step")
