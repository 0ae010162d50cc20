"""The CPU stand-ins every simulator runs under: fake tensors, a fake process group, and CUDA's
choices (autocast's fp32 list, fused dropout, SDPA's kernel, in-place gradient sums, no packed-sequence
guess) made on the CPU, and the scratch tensor an op allocates inside its own kernel (``kernel_scratch``).

What belongs here: context managers that make a CPU step allocate what the same step allocates on a
GPU, shared by the step (``advisor.simulate.step``), the mesh step, the pipeline stage, the MoE layer
and the traced profiles. What does not: building the model (``advisor.simulate.model``), measuring
(``advisor.simulate.measure``). Why each stand-in is needed: ``advisor.simulate.step``'s docstring.

Imports torch (lazily); the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
from typing import Any

from advisor.training import TrainingConfig


def fake_mode() -> Any:
    """A ``FakeTensorMode``: tensors with shapes and dtypes but no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@contextlib.contextmanager
def fake_process_group(world_size: int):
    """A fake default process group of ``world_size`` ranks (this process is rank 0)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError("simulate needs its own (fake) process group; a process group is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def cuda_autocast_policy(training: TrainingConfig) -> Any:
    """CUDA's autocast fp32 op list for CPU autocast under a mixed precision (``advisor.simulate.autocast``)."""
    from advisor.simulate.autocast import cuda_fp32_policy

    return cuda_fp32_policy() if training.mixed else contextlib.nullcontext()


@contextlib.contextmanager
def cuda_dropout():
    """On CUDA, ``F.dropout`` in training runs the fused ``native_dropout`` and saves a bool mask
    (aten/src/ATen/native/Dropout.cpp ``is_fused_kernel_acceptable``); on the CPU it multiplies by a
    noise tensor in the input's dtype and saves that. Run CUDA's op (it has a CPU kernel)."""
    import torch
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0 or inplace:
            return original(input, p, training, inplace)
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


@contextlib.contextmanager
def cuda_kernels():
    """CUDA's SDPA kernel where it is not the CPU's, its in-place sum of a parameter's two gradients, its
    grouped matmul of other dtypes than bf16 (``advisor.simulate.cuda_kernels``) and the scratch a kernel
    holds (``kernel_scratch``). Enter it after the fake mode and before the memory tracker; CUDA's softmax
    backward product (``cuda_kernels.cuda_softmax_backward``) is entered inside the tracker instead."""
    from advisor.simulate.cuda_kernels import cuda_grad_accumulation, cuda_grouped_mm, cuda_sdpa

    with cuda_sdpa(), cuda_grad_accumulation(), cuda_grouped_mm(), kernel_scratch():
        yield


@contextlib.contextmanager
def kernel_scratch():
    """Allocate, beside ``torch.logsumexp``'s output, the scratch its kernel holds: a dispatch mode (the
    memory trackers) sees one aten op and its output, but the kernel, the same code on CPU and CUDA
    (aten/src/ATen/native/ReduceOps.cpp ``logsumexp_out_impl``, CompositeExplicitAutograd), allocates
    ``amax(self)`` and ``self - maxes``, as large as its input, while its result exists. Measured with the
    profiler on real CPU tensors (tests/estimate/test_loss_fused.py): 64 x 8,000 fp32 logits, 2,048,000
    bytes. The fused loss kernel (``wrappers.losses``) calls it on each chunk's fp32 logits, which makes
    this one chunk's logits a step holds at the loss. After the op returns, so the scratch is live with
    the op's output (its ``result``) and, under autocast's fp32 list, with the input's fp32 cast, as in
    the kernel; ``Tensor.logsumexp`` is not redirected (nothing the steps run calls it)."""
    import torch

    original = torch.logsumexp

    def logsumexp(input, dim, keepdim=False, *, out=None):
        result = original(input, dim, keepdim) if out is None else original(input, dim, keepdim, out=out)
        if input.numel():
            with torch.no_grad():
                seen = input.to(result.dtype)  # the op's input as the kernel saw it (autocast's fp32 cast)
                maxes = torch.amax(seen, dim, keepdim=True)
                scratch = seen - maxes
                del seen, maxes, scratch
        return result

    torch.logsumexp = logsumexp
    try:
        yield
    finally:
        torch.logsumexp = original


@contextlib.contextmanager
def unpacked_batches():
    """Hugging Face looks for packed sequences in ``position_ids`` (``masking_utils.
    find_packed_sequence_indices``) and, unable to read a fake tensor's values, assumes packing and
    builds an s x s mask, which sends SDPA to another kernel. Our batches hold one sequence per row,
    for which a real run finds none: say so without reading values."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def mesh_outside_fake_mode() -> Any:
    """``DeviceMesh`` reads its rank list back with ``tolist()``, which a fake tensor cannot do: build
    the mesh outside the fake mode (it holds a few integers) and hand it to ``apply_recipe``."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    with unset_fake_temporarily():
        return DeviceMesh.from_group(dist.group.WORLD, device_type="cpu")
