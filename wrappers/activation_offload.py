"""Activation offloading: what the model's body saves for backward waits in CPU memory (``--activation-offload``).

The hooks are torchtune's design (``OffloadActivations``, read at 1814feb1; the estimate's model is in
``advisor.estimate.activation_offload``): a ``saved_tensors_hooks`` pair that, for every saved tensor of at
least 1,024 bytes that is not a parameter, keeps a copy in CPU memory and drops the GPU tensor once five more
tensors have been saved (the forward stash); backward brings it back when its node asks. They are active over
the body of the model, the module that holds the blocks (a Hugging Face model's decoder: embeddings, blocks,
final norm), so the output head and the loss keep theirs on the GPU, as torchtune's no-op around its head and
its loss outside the context do. Under non-reentrant checkpointing only each block's input and the final
norm's tensors reach them.

Transfers run on the compute stream (``non_blocking`` into pinned memory): correct, but serialised with the
compute, where torchtune overlaps them on a side stream, which the plan's step time assumes (``offload_s`` bounds
what this costs more).

``host=False`` is the simulator's (``advisor.simulate``): fake tensors have no data to copy, so a pack keeps
the shape and a backward gets a new tensor of it, which is what the GPU sees.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from wrappers.blocks import find_blocks

MIN_BYTES = 1024  # torchtune's min_offload_size
STASH = 5  # torchtune's max_fwd_stash_size


class OffloadActivations(saved_tensors_hooks):
    """Saved tensors of ``MIN_BYTES`` or more, parameters aside, held in CPU memory (``host=True``, tensors on
    ``devices`` only: a GPU's; the tests copy CPU tensors too) or forgotten and made again in backward
    (``host=False``: fake tensors, any device)."""

    def __init__(self, *, host: bool = True, stash: int = STASH, min_bytes: int = MIN_BYTES,
                 devices: tuple[str, ...] = ("cuda",)) -> None:
        self.host, self.stash_size, self.min_bytes, self.devices = host, stash, min_bytes, devices
        self._ids = itertools.count(1)  # unique under DataParallel's replica threads too (next() holds the GIL)
        self.stash: dict[int, torch.Tensor] = {}
        self.offloaded_bytes = 0  # in the last forward
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> Any:
        tid = next(self._ids)
        nbytes = tensor.element_size() * tensor.nelement()
        movable = tensor.device.type in self.devices if self.host else True
        if nbytes < self.min_bytes or isinstance(tensor, nn.Parameter) or not movable:
            return ("kept", tensor)
        if not self.stash:
            self.offloaded_bytes = 0  # a new forward
        for old in [k for k in self.stash if k <= tid - self.stash_size]:
            del self.stash[old]
        self.stash[tid] = tensor
        self.offloaded_bytes += nbytes
        if self.host:
            copy = torch.empty_like(tensor, device="cpu", pin_memory=tensor.is_cuda)  # strides kept (torchtune's)
            copy.copy_(tensor, non_blocking=True)
            return ("host", tid, copy, tensor.device)
        return ("shape", tid, (tensor.size(), tensor.stride(), tensor.dtype, tensor.device))

    def _unpack(self, packed: Any) -> torch.Tensor:
        if packed[0] == "kept":
            return packed[1]
        tid = packed[1]
        stashed = self.stash.get(tid)
        self.stash.clear()  # backward has begun: the forward's stash goes (torchtune's first backward hook)
        if stashed is not None:
            return stashed
        if packed[0] == "host":
            return packed[2].to(packed[3], non_blocking=True)
        size, stride, dtype, device = packed[2]
        return torch.empty_strided(size, stride, dtype=dtype, device=device)


def model_body(model: nn.Module) -> nn.Module:
    """The deepest module holding every block that is not a bare container (a Hugging Face causal LM's
    decoder, ``model.model``); ``model`` itself where no blocks are found."""
    blocks = find_blocks(model)
    if not blocks:
        return model
    wanted = {id(b) for b in blocks}
    body, depth = model, 0
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) or not name:
            continue
        inside = {id(m) for m in module.modules()}
        if wanted <= inside and name.count(".") + 1 > depth:
            body, depth = module, name.count(".") + 1
    return body


def apply_activation_offload(model: nn.Module, *, host: bool = True,
                             devices: tuple[str, ...] = ("cuda",)) -> OffloadActivations:
    """Run ``model``'s body under ``OffloadActivations`` on every forward; returns the hooks (their
    ``offloaded_bytes`` is the last forward's)."""
    hooks = OffloadActivations(host=host, devices=devices)
    body = model_body(model)
    body.register_forward_pre_hook(lambda *args: hooks.__enter__())
    body.register_forward_hook(lambda *args: hooks.__exit__(None, None, None), always_call=True)
    return hooks
