"""Single-process ``torch.nn.DataParallel``: one process drives several CUDA GPUs of one node.

Only sensible when the job was not launched with one process per GPU; PyTorch recommends DDP
instead (the GIL and the per-step model replication make DataParallel slower). Nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def apply_dp(
    model: nn.Module, *, device: torch.device | str, device_ids: Sequence[int] | None = None
) -> nn.DataParallel:
    """Move ``model`` to ``device`` and wrap it in ``torch.nn.DataParallel(device_ids=...)``.

    ``device_ids`` defaults to every CUDA GPU this process sees (DataParallel's own default).
    ``ValueError`` unless ``device`` is a CUDA device and there are at least two GPUs to use.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"DataParallel needs CUDA GPUs; got device {device}")
    ids = list(range(torch.cuda.device_count())) if device_ids is None else list(device_ids)
    if len(ids) < 2:
        raise ValueError(f"DataParallel needs at least two CUDA GPUs in one process; got {len(ids)}")
    model.to(device)
    return nn.DataParallel(model, device_ids=ids, output_device=device)
