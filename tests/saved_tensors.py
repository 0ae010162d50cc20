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
