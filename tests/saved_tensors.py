"""One way to measure activations for the per-block tests: the bytes of distinct storages autograd
saves in one training forward, parameters excluded, with CUDA's dropout emulated on the CPU as the
simulator runs it (``advisor.simulate.fake_env.cuda_dropout``)."""

from __future__ import annotations

import gc
import weakref

import torch

from advisor.simulate.fake_env import cuda_dropout


def saved_forward_bytes(model: torch.nn.Module, *, autocast: bool = False, **inputs) -> int:
    """Counted once the forward has returned, with its output still held: only what the graph keeps
    (a tensor saved by a branch the output does not depend on is freed, and its address may be reused
    by a later one: counting at pack time by address was order- and allocator-dependent). ``autocast``:
    the forward under CPU autocast to bf16 (weights kept in their own dtype)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    aliases = []

    def pack(tensor):
        alias = tensor.detach()  # a handle that lives exactly as long as the graph keeps the tensor
        aliases.append(weakref.ref(alias))
        return alias

    with cuda_dropout(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**inputs)
    gc.collect()
    alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (r() for r in aliases)
             if t is not None and t.untyped_storage().data_ptr() not in weights}
    del out
    return sum(alive.values())


def qwen_tower_saved_bytes(tower_class: type, config, dtype: torch.dtype, grid: int) -> int:
    """``saved_forward_bytes`` of a Qwen2-VL / Qwen2.5-VL vision tower (SDPA) built from ``config`` in
    ``dtype`` over one image of ``grid`` x ``grid`` patches (3 channels, flattened as the processor does)."""
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = tower_class._from_config(config).to(dtype).train()
    width = 3 * config.temporal_patch_size * config.patch_size ** 2
    pixels = torch.randn(grid * grid, width, dtype=dtype, generator=torch.Generator().manual_seed(0))
    return saved_forward_bytes(tower, hidden_states=pixels, grid_thw=torch.tensor([[1, grid, grid]]))
