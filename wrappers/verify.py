"""After ``wrap()`` applied a recipe: check that the model really is what the decision claims.

A decision that says "zero3 on 2 processes, bf16-mixed" while the processes run unsynchronised,
unsharded or in fp32 is worse than an error: every rank trains on its own, the losses look fine and
the run exits 0. So ``wrap()`` reads back what was built, and ``verify_applied`` raises
``RuntimeError`` with one paragraph saying what differs and why it matters. What is expected follows
from the strategy table's torch ``Implementation`` fields (``single_process``, ``shard_params``,
``shard_optimizer``, ``offload_params``) and the precision table, never from strategy names:

- the process group: initialised, with the launcher's world size (``WORLD_SIZE``);
- the wrapping: ``DataParallel`` over at least two GPUs (single process); FSDP2 ``fully_shard`` on
  the root and each block, every parameter a ``DTensor`` sharded over the world, the offload policy
  as claimed (sharded parameters); ``DistributedDataParallel`` over the world otherwise, with a
  ``ZeroRedundancyOptimizer`` over the world when the optimizer state is sharded;
- on a device mesh (``wrap(mesh=...)``, ``mesh_problems``): every parameter a ``DTensor`` sharded on
  the FSDP dimensions, replicated on dp_replicate (HSDP), and sharded on tp where the TP plan split it;
- the precision: every parameter in the claimed parameter dtype, and the claimed compute dtype
  where it is applied (FSDP2's ``MixedPrecisionPolicy``, else the autocast hooks of
  ``wrappers.precision.apply_autocast``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from advisor.precision import Precision
from advisor.strategies import STRATEGIES, Implementation, StrategyName
from wrappers.blocks import find_blocks
from wrappers.precision import autocast_dtype, precision_dtypes


def group_problem(world_size: int) -> str | None:
    """What is wrong with this process's default group for a launch of ``world_size``; None if nothing."""
    if world_size <= 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return (f"the launcher started {world_size} processes (WORLD_SIZE={world_size}) but this one is in no "
                "process group")
    if dist.get_world_size() != world_size:
        return (f"the launcher started {world_size} processes (WORLD_SIZE={world_size}) but the process group "
                f"has {dist.get_world_size()}")
    return None


def _group_size(group: dist.ProcessGroup | None) -> int:
    return group.size() if group is not None else dist.get_world_size()


def fsdp_problems(model: nn.Module, impl: Implementation, world_size: int, compute: torch.dtype | None) -> list[str]:
    """What differs from FSDP2 as ``impl`` applies it over ``world_size`` ranks (empty: nothing)."""
    if not isinstance(model, FSDPModule):
        return [f"the model is a {type(model).__name__}, not sharded with FSDP2 fully_shard"]
    problems = []
    unsharded = [type(b).__name__ for b in find_blocks(model) if not isinstance(b, FSDPModule)]
    if unsharded:
        problems.append(f"{len(unsharded)} block(s) ({unsharded[0]}) are not fully_shard units")
    params = list(model.parameters())
    if not all(isinstance(p, DTensor) for p in params):
        problems.append("some parameters are not DTensor shards")
    elif {p.device_mesh.size() for p in params} != {world_size}:
        problems.append(f"parameters are sharded over {sorted({p.device_mesh.size() for p in params})} ranks, "
                        f"not {world_size}")
    state = model._get_fsdp_state()  # FSDP2 keeps its policies on the state and its parameter groups
    policy = state._mp_policy.param_dtype
    if policy != compute:
        problems.append(f"FSDP2 computes in {policy or 'the parameter dtype'}, not {compute or 'the parameter dtype'}")
    offloaded = {isinstance(g.offload_policy, CPUOffloadPolicy) for g in state._fsdp_param_groups}
    if offloaded and offloaded != {impl.offload_params}:
        problems.append(f"CPU offload is {'on' if True in offloaded else 'off'}, the strategy says "
                        f"{'on' if impl.offload_params else 'off'}")
    return problems


def _replicated_problems(model: nn.Module, optimizer: torch.optim.Optimizer | None, impl: Implementation,
                         world_size: int, compute: torch.dtype | None) -> list[str]:
    problems = []
    if impl.single_process:
        if not isinstance(model, nn.DataParallel) or len(model.device_ids) < 2:
            problems.append(f"the model is a {type(model).__name__}, not DataParallel over two or more GPUs")
    elif not isinstance(model, DistributedDataParallel):
        problems.append(f"the model is a {type(model).__name__}, not DistributedDataParallel")
    elif _group_size(model.process_group) != world_size:
        problems.append(f"DDP averages gradients over {_group_size(model.process_group)} process(es), not {world_size}")
    if impl.shard_optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # ~0.45 s to import: only here

        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            problems.append(f"the optimizer is a {type(optimizer).__name__}, not a ZeroRedundancyOptimizer")
        elif optimizer.world_size != world_size:
            problems.append(f"the optimizer state is split over {optimizer.world_size} ranks, not {world_size}")
    inner = getattr(model, "module", model)
    if autocast_dtype(inner) != compute:
        problems.append(f"the forward runs under autocast to {autocast_dtype(inner)}, not {compute}")
    return problems


def verify_applied(model: nn.Module, optimizer: torch.optim.Optimizer | None, *, strategy: StrategyName | None,
                   precision: Precision, world_size: int) -> None:
    """``RuntimeError`` unless ``model`` (and ``optimizer``) are what ``strategy`` on ``world_size``
    processes in ``precision`` means; see the module docstring. ``strategy=None``: the model was
    left unwrapped, which is only right for one process."""
    impl = None if strategy is None else STRATEGIES[strategy].on("torch")
    problems = [] if impl is not None and impl.single_process else [p for p in [group_problem(world_size)] if p]
    dtypes = precision_dtypes(precision)
    if impl is None:
        if world_size > 1:
            problems.append("the model was left unwrapped, so nothing synchronises the ranks")
    elif not problems:  # a wrong group makes the wrapping checks below meaningless
        problems += (fsdp_problems(model, impl, world_size, dtypes.compute_dtype) if impl.shard_params
                     else _replicated_problems(model, optimizer, impl, world_size, dtypes.compute_dtype))
    stored = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if stored - {dtypes.param_dtype}:
        problems.append(f"parameters are stored in {', '.join(sorted(map(str, stored)))}, not {dtypes.param_dtype}")
    if problems:
        claim = f"{strategy or 'an unwrapped model'} on {world_size} process(es) in {precision}"
        raise RuntimeError(
            f"wrap() decided on {claim}, but {'; '.join(problems)}. Training on would not be what the decision "
            "says (unsynchronised ranks each train on their whole shard of data alone, or memory and precision "
            "differ from the plan), so wrap() stops here. Start the script with `advisor launch` or torchrun "
            "so that every process joins one process group of WORLD_SIZE ranks before wrap(), or pass the "
            "strategy and precision that this launch can run."
        )


def mesh_problems(model: nn.Module, *, shard_dims: tuple[str, ...], replicate_dims: tuple[str, ...],
                  tp_modules: tuple[str, ...]) -> list[str]:
    """What differs from a model sharded by FSDP2 over ``shard_dims`` (every parameter ``Shard`` there),
    replicated over ``replicate_dims`` (HSDP), and split over ``tp`` in the modules ``tp_modules``."""
    from wrappers.optim import canonical_param_name

    problems = []
    split = tuple(f"{name}." for name in tp_modules)
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            problems.append(f"{name} is not a DTensor")
            continue
        placement = dict(zip(param.device_mesh.mesh_dim_names or (), param.placements))
        want = {dim: "shard" for dim in shard_dims} | {dim: "replicate" for dim in replicate_dims}
        if canonical_param_name(name).startswith(split):
            want["tp"] = "shard"
        for dim, kind in want.items():
            got = placement.get(dim)
            # FSDP2 over a TP-sharded dim records the outer split as _StridedShard (not a Shard subclass).
            sharded = got is not None and (got.is_shard() or type(got).__name__ == "_StridedShard")
            if got is None or (sharded if kind == "shard" else got.is_replicate()) is False:
                problems.append(f"{name} is {got or 'not on the mesh'} on {dim}, not {kind}")
                break
    return problems[:3]
