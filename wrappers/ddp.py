"""DDP: every rank holds the whole model and optimizer; gradients are averaged in backward.

Only the wrapping lives here. Mixed precision under DDP is ``torch.autocast`` around the forward,
which the training loop enters (``recipe.autocast_context``); parameters stay as they are.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(
    model: nn.Module, *, device: torch.device | str, process_group: dist.ProcessGroup | None = None
) -> DistributedDataParallel:
    """Move ``model`` to ``device`` and wrap it in ``torch.nn.parallel.DistributedDataParallel``.

    ``device_ids=[device]`` on CUDA and ``None`` otherwise (CPU/gloo), as DDP requires; default
    bucket sizes; ``gradient_as_bucket_view=False`` so gradients are separate tensors from the
    communication buckets (the memory estimate counts them separately). Parameters keep their
    identity, so an optimizer built on them stays valid. A model on the meta device is not moved.
    """
    device = torch.device(device)
    if not any(p.is_meta for p in model.parameters()):
        model.to(device)
    device_ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, process_group=process_group, gradient_as_bucket_view=False
    )
