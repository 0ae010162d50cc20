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

Measured with ``torch.distributed._tools.mem_tracker.MemTracker`` (not ``LiveBytes``): FSDP1 frees an
unsharded flat parameter by resizing its storage to 0 (torch/distributed/fsdp/_flat_param.py
``_free_storage``), which only MemTracker's ``UntypedStorage.resize_`` patch sees. The tracker's
"Parameter" category holds the sharded flat parameters, its "Gradient" the sharded gradients and the
unsharded gradient while it lives, "Temp" the rest.

The step runs without autocast, as the FSDP2 simulation does: FSDP1's MixedPrecision already computes in
bf16 (accelerate also wraps the forward in autocast, which changes only the fp32 op list's outputs).
Real tensors, not fake ones: FSDP1 tells storages apart by ``data_ptr()`` (torch/distributed/fsdp/_flat_param.py
``_same_storage``, ``_writeback_orig_params``'s ``_data_ptr_allocated``; _runtime_utils.py ``_reshard``'s
``already_resharded`` check), and every fake tensor's is 0: under FakeTensorMode the second step's pre-backward
fails with "If skipped using sharded views, the unsharded flat parameter should be allocated". So only small
models are simulated (the collectives of the fake process group still move nothing).
Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from advisor.simulate.fake_env import cuda_dropout, fake_process_group, unpacked_batches
from advisor.simulate.measure import breakdown, peak_total, skip_frozen_grad_hooks
from advisor.simulate.model import build_optimizer, freeze_to, materialize, meta_model, net_vocab, resolve_config
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

# Our strategy -> FSDP1's ShardingStrategy (torch/distributed/fsdp/api.py): zero3 FULL_SHARD, zero2
# SHARD_GRAD_OP (parameters kept unsharded from forward to backward).
SHARDING = {"zero3": "FULL_SHARD", "zero2": "SHARD_GRAD_OP"}


def simulate_fsdp1(model: str | dict, *, world_size: int, strategy: str, training: TrainingConfig,
                   micro_batch_size: int, checkpointing: bool) -> dict[str, Any]:
    """One rank's peak of the second step: ``{"peak_allocated", "phase_peaks", params, grads, optimizer,
    activations, temporary, wall_s}`` (phase_peaks: the running peak after forward, backward and step)."""
    import torch

    if strategy not in SHARDING:
        raise ValueError(f"FSDP1 simulates {', '.join(SHARDING)}, not '{strategy}'")
    if get_strategy(strategy).on("torch").offload_params:
        raise ValueError("offload is not simulated")
    start = time.perf_counter()
    _, cfg = resolve_config(model)
    meta = meta_model(cfg, training)
    # Real tensors (see the module docstring: FSDP1 compares storages by data_ptr, 0 for every fake tensor).
    with fake_process_group(world_size), unpacked_batches(), cuda_dropout():
        frozen = getattr(torch, training.precision_info.compute_dtype) if training.low_precision_base else None
        materialize(meta, device="cpu", real=True,
                    dtype=torch.bfloat16 if training.precision == "bf16" else None, frozen_dtype=frozen)
        freeze_to(meta, None)
        meta.train()
        net = _wrap_fsdp1(meta, strategy, training, checkpointing)
        opt = build_optimizer([p for p in net.parameters() if p.requires_grad], training)
        ids = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.seq_len))
        _step(net, opt, ids, None)
        tracker = _tracker()
        tracker.track_external(net, opt, ids)
        phases: dict[str, int] = {}
        with tracker:
            skip_frozen_grad_hooks(tracker, net)
            _step(net, opt, ids, lambda phase: phases.__setitem__(phase, peak_total(tracker)))
        measured = breakdown(tracker)
    return {"peak_allocated": sum(measured.values()), "phase_peaks": phases, **measured,
            "wall_s": round(time.perf_counter() - start, 3)}


def _tracker() -> Any:
    """A MemTracker that does not hook the parameters of each module it enters: under use_orig_params FSDP1
    swaps them for views of the unsharded flat parameter during forward (torch/distributed/fsdp/_flat_param.py
    ``_use_unsharded_views``), on which a post-accumulate-grad hook cannot be registered. Module statistics are
    not read; the categories come from the storages themselves."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> tuple[int, int]:
            return 0, 0

    return Tracker()


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
    wrapped = FSDP(net, sharding_strategy=ShardingStrategy[SHARDING[strategy]], mixed_precision=mixed,
                   auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=kinds),
                   backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True, use_orig_params=True,
                   device_id=torch.device("cpu"))
    if checkpointing:
        apply_activation_checkpointing(
            wrapped, check_fn=lambda m: type(m) in kinds,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return wrapped


def _step(net: Any, opt: Any, ids: Any, mark: Any) -> None:
    mark = mark or (lambda phase: None)
    loss = net(input_ids=ids, labels=ids).loss
    mark("forward")
    loss.backward()
    del loss
    mark("backward")
    opt.step()
    opt.zero_grad(set_to_none=True)
    mark("optimizer_step")
