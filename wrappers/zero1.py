"""ZeRO stage 1: DDP for the model, optimizer state partitioned across ranks.

``torch.distributed.optim.ZeroRedundancyOptimizer`` gives each rank whole parameters to own
(greedy by size, ``_partition_parameters``); a rank keeps optimizer state only for those, steps them,
and broadcasts them after the step. Gradients stay replicated (DDP all-reduce), which is what makes
this stage 1 and not stage 2.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from wrappers.ddp import apply_ddp
from wrappers.optim import constructor_kwargs

# Group keys that are not hyper-parameters and are not passed on to ZeroRedundancyOptimizer.
_NOT_SETTINGS = ("params", "param_names")


def apply_zero1(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device | str,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[DistributedDataParallel, ZeroRedundancyOptimizer]:
    """Wrap ``model`` in DDP (``apply_ddp``) and rebuild ``optimizer`` as a ``ZeroRedundancyOptimizer``.

    ``optimizer_class`` is the given optimizer's class and ``**defaults`` its constructor
    hyper-parameters (``optimizer.defaults`` filtered by the constructor's signature); every param
    group is passed on with its own hyper-parameters (ZeroRedundancyOptimizer accepts groups).
    Group keys the class's constructor does not accept are dropped with a warning. The given
    optimizer's parameters must be ``model``'s: DDP keeps parameter identity, so they still are
    after wrapping. Its state, if any, is dropped with a warning.
    """
    cls = type(optimizer)
    if optimizer.state:
        warnings.warn("apply_zero1: the given optimizer's state is dropped", stacklevel=2)
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        settings = constructor_kwargs(cls, group)
        dropped = sorted(set(group) - set(settings) - set(_NOT_SETTINGS) - set(optimizer.defaults))
        if dropped:
            warnings.warn(f"apply_zero1: param group {index} keys not mapped: {', '.join(dropped)}", stacklevel=2)
        groups.append({"params": list(group["params"]), **settings})
    wrapped = apply_ddp(model, device=device, process_group=process_group)
    zero = ZeroRedundancyOptimizer(
        groups,
        optimizer_class=cls,
        process_group=process_group,
        **constructor_kwargs(cls, optimizer.defaults),
    )
    return wrapped, zero
