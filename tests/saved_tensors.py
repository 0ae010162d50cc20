"""One way to measure activations for the per-block tests: the bytes of distinct storages autograd
saves in one training forward, parameters excluded, with CUDA's dropout emulated on the CPU as the
simulator runs it (``advisor.simulate.step.cuda_dropout``)."""

from __future__ import annotations

import torch

from advisor.simulate.step import cuda_dropout


def saved_forward_bytes(model: torch.nn.Module, **inputs) -> int:
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with cuda_dropout(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(**inputs)
    return sum(saved.values())


def qwen_tower_saved_bytes(tower_class: type, config, dtype: torch.dtype, grid: int) -> int:
    """``saved_forward_bytes`` of a Qwen2-VL / Qwen2.5-VL vision tower (SDPA) built from ``config`` in
    ``dtype`` over one image of ``grid`` x ``grid`` patches (3 channels, flattened as the processor does)."""
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = tower_class._from_config(config).to(dtype).train()
    width = 3 * config.temporal_patch_size * config.patch_size ** 2
    pixels = torch.randn(grid * grid, width, dtype=dtype, generator=torch.Generator().manual_seed(0))
    return saved_forward_bytes(tower, hidden_states=pixels, grid_thw=torch.tensor([[1, grid, grid]]))
