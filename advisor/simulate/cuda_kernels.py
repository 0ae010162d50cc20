"""Choices CUDA makes differently from the CPU, made on the CPU as CUDA makes them while a simulator runs:
which kernel runs ``scaled_dot_product_attention``, whether autograd sums a parameter's two gradients
in place, and the product softmax's backward kernel allocates.

What belongs here: the rule each choice follows on a GPU (with its PyTorch source) and the context
manager that applies it to the simulated step. The other stand-ins (fake tensors, autocast's fp32 list,
fused dropout) are in ``advisor.simulate.fake_env``, which enters these with the rest (``cuda_kernels``).

SDPA. ``torch.nn.functional.scaled_dot_product_attention`` picks a kernel per call on CUDA
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``select_sdp_backend``, torch 2.13 on sm80 or
newer: cuDNN where preferred, flash, memory-efficient, math, each behind its ``can_use_*`` checks);
on the CPU (sdp_utils_cpp.cpp) it picks the CPU's flash kernel whenever it can, in fp32 and for
grouped-query attention too. Flash and cuDNN take only fp16 / bf16 (``check_dtypes_low_precision``) and
no ``attn_mask`` (flash's ``check_for_attn_mask``); the memory-efficient kernel takes fp32 too, and masks,
but not grouped-query inputs in torch 2.13: its dense check is ``check_batch_size_and_num_heads_dense``
without GQA support (the installed header, include/ATen/native/transformers/sdp_utils_cpp.h, has the
two-parameter template of 2.13; its backward's meta function, torch/_meta_registrations.py
``meta__scaled_dot_product_efficient_backward``, sizes the key's gradient with the query's heads).
PyTorch #191085 (July 2026, after 2.13) adds GQA to that kernel. So fp32 inputs with ``enable_gqa``
and fewer key/value heads run the math kernel, ``_scaled_dot_product_attention_math``, a composite
of ordinary ops (aten/src/ATen/native/transformers/attention.cpp) that saves the scaled query, the
repeated keys and values and the b x heads x s x s fp32 probabilities. Transformers passes
``enable_gqa`` only without a mask (``integrations/sdpa_attention.use_gqa_in_sdpa`` on CUDA; with a
mask it repeats k and v itself, and the memory-efficient kernel runs). Measured on an H100 (torch
2.11, transformers 5.17): a 64-wide fp32 Llama block with 4 heads and 2 key/value heads saved 7,432
bytes a token under SDPA, as under eager attention (tests/estimate/test_activations.py). The CPU's
flash kernel stands in for flash, cuDNN and memory-efficient (each saves q, k, v, the output and an
fp32 log-sum-exp); where CUDA's choice is math, the simulator runs the same composite on the CPU.

Tied gradients. Autograd's engine sums two gradients that meet at one input in place when it holds
the last reference to the first, a plain tensor that is non-overlapping and dense, and the second is
no tensor subclass (torch/csrc/autograd/input_buffer.cpp ``accumulate`` and ``can_accumulate_inplace``;
``at::isTensorSubclassLike`` is also true while any ``TorchDispatchMode`` is active). Fake tensors are
a subclass and the memory tracker is a dispatch mode, so the simulated engine always adds out of place,
one gradient-sized tensor more at that moment. The case that decides a peak is a tied embedding under
autocast: the head's gradient reaches the shared matrix as the cast node's fresh fp32 copy and waits
in the buffer of the matrix's ``AccumulateGrad`` until the embedding's arrives; a GPU adds the second
into it (tests/estimate/test_ddp_backward_end.py checks the mechanism on real tensors). Qwen2.5-0.5B,
bf16-mixed DDP x2, micro-batch 1, seq 256, fused AdamW: the H100 allocated 10,516,265,984 bytes
(benchmarks/results/gpu_stacks.md); the simulated step, summed in place, 10,426,114,960 (-0.86%; the
estimate 10,425,193,984), out of place as before 10,969,736,080 (+4.31%). Without autocast the head's gradient is a transposed view
(``TBackward0``), which shares its base's storage: out of place on a GPU too. ``cuda_grad_accumulation``
applies the rule to the buffer of a parameter's ``AccumulateGrad``. Other buffers (the residual
stream's branches, a chunked loss's head gradients) still add out of place: the engine's sum there
cannot be told from a backward formula's own ``add`` by a dispatch mode.

Softmax backward. CUDA's ``_softmax_backward_data`` (aten/src/ATen/native/cuda/SoftMax.cu
``softmax_backward_cuda_out``) first computes ``Tensor tmp = grad * output`` and runs its kernel on that, so
while it writes the input's gradient it holds a product as large as the incoming gradient (in its dtype);
the CPU kernel allocates nothing. Eager attention's ``softmax(dtype=float32)`` runs it on b x heads x s x s
fp32 scores. Measured on an H100 (torch 2.11, transformers 5.17; ``benchmarks/op_trace.py`` on
``gpu_truth.measure``): a 350M MHA Llama, 16 heads, s 4096, micro-batch 1, eager attention: the step's peak
is reached inside that operator, 1.000 GiB (one fp32 score tensor, 16 x 4096 x 4096 x 4 bytes) above the
allocated bytes before it plus its 1 GiB output, under DDP with checkpointing (9.205 GiB) and under ZeRO-3
(29.966 GiB); the estimate without the product was 12.4% and 3.6% below those runs.
``cuda_softmax_backward`` allocates the same product beside the CPU's kernel.

Imports torch (lazily); the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

SdpaKernel = Literal["flash", "efficient", "math"]
LOW_PRECISION = ("torch.float16", "torch.bfloat16")  # flash's and cuDNN's dtypes (check_dtypes_low_precision)
EFFICIENT = ("torch.float32", "torch.float16", "torch.bfloat16")  # sm80+: greater_than_or_equal_sm80_mem_efficient_dtypes
FLASH_MAX_HEAD_DIM = 256  # check_head_dim_size_flash


def cuda_sdpa_kernel(query: Any, key: Any, value: Any, *, has_mask: bool, enable_gqa: bool) -> SdpaKernel:
    """The kernel torch 2.13 runs for dense (b, heads, s, d) inputs on an sm80+ GPU ("flash" also stands
    for cuDNN, which saves the same tensors). ``query``, ``key``, ``value``: anything with ``shape`` and
    ``dtype``. See the module docstring for the source of each check."""
    dtype = str(query.dtype)
    q_heads, k_heads, v_heads = query.shape[-3], key.shape[-3], value.shape[-3]
    d_q, d_k, d_v = query.shape[-1], key.shape[-1], value.shape[-1]
    same_heads = q_heads == k_heads == v_heads
    grouped = enable_gqa and k_heads == v_heads and q_heads % k_heads == 0  # check_grouped_query_attention
    if (dtype in LOW_PRECISION and not has_mask and d_q == d_k == d_v <= FLASH_MAX_HEAD_DIM
            and (same_heads or grouped)):
        return "flash"
    # minimum_gemm_alignment on sm80+: 128 bits of the dtype (4 fp32 elements, 8 half ones)
    alignment = 4 if dtype == "torch.float32" else 8
    if dtype in EFFICIENT and same_heads and d_q == d_k and d_q % alignment == 0 and d_v % alignment == 0:
        return "efficient"
    return "math"


class _Meta(NamedTuple):
    """What ``cuda_sdpa_kernel`` reads of a tensor."""

    shape: Any
    dtype: Any


@contextlib.contextmanager
def cuda_sdpa() -> Iterator[None]:
    """Run ``F.scaled_dot_product_attention`` with the math composite where CUDA would (the module
    docstring); every other call keeps the CPU's kernel."""
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        # Under autocast the kernel sees its inputs cast to the autocast dtype (SDPA is on autocast's
        # lower-precision list, aten/src/ATen/autocast_mode.cpp): bf16 or fp16, whatever they were.
        device = query.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype
        cast = [_Meta(t.shape, dtype) for t in (query, key, value)]
        kernel = cuda_sdpa_kernel(*cast, has_mask=attn_mask is not None, enable_gqa=enable_gqa)
        if kernel != "math" or query.dim() != 4:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _accumulates_in_place(first: Any) -> bool:
    """``can_accumulate_inplace`` for the gradient already in the buffer, less the subclass test: not a
    view, non-overlapping and dense, its storage held by this tensor alone (2: ours and the handle
    ``untyped_storage()`` makes to count). The tensor's own reference count is not readable from
    Python: a second holder of the same tensor (a hook keeping it) would pass."""
    import torch
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return (first._base is None and is_non_overlapping_and_dense_or_false(first)
            and torch._C._storage_Use_Count(first.untyped_storage()._cdata) == 2)


def _into_accumulate_grad(node: Any, shape: Any) -> bool:
    """Whether ``node`` (the engine's current node, whose outputs are being summed into the buffers of
    its next nodes) feeds a parameter of ``shape`` directly."""
    return any(n is not None and n.name() == "torch::autograd::AccumulateGrad" and n.variable.shape == shape
               for n, _ in node.next_functions)


@contextlib.contextmanager
def cuda_grad_accumulation() -> Iterator[None]:
    """Sum a parameter's gradients in place where CUDA's engine would (the module docstring): a
    dispatch mode that turns the engine's ``add`` into the buffer of an ``AccumulateGrad`` into ``add_``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    add, add_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor

    class InPlaceAccumulation(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is add and not kwargs and len(args) == 2 and not torch.is_grad_enabled():
                node = torch._C._current_autograd_node()
                first, second = args
                if (node is not None and isinstance(second, torch.Tensor) and first.shape == second.shape
                        and first.dtype == second.dtype and _into_accumulate_grad(node, first.shape)
                        and _accumulates_in_place(first)):
                    return add_(first, second)
            return func(*args, **kwargs)

    with InPlaceAccumulation():
        yield


@contextlib.contextmanager
def cuda_softmax_backward() -> Iterator[None]:
    """Hold CUDA's ``grad * output`` while ``_softmax_backward_data`` runs (the module docstring): a dispatch
    mode that computes the product, runs the operator and then drops the product. Enter it inside the memory
    tracker (a dispatch mode too): the product and the operator then pass through the tracker, which counts
    the product live with the operator's output, as the GPU's allocator holds them; a mode below the tracker
    would hide the product from it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    softmax_backward, mul = torch.ops.aten._softmax_backward_data.default, torch.ops.aten.mul.Tensor

    class ProductFirst(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is softmax_backward:
                product = mul(args[0], args[1])
                result = func(*args, **(kwargs or {}))
                del product
                return result
            return func(*args, **(kwargs or {}))

    with ProductFirst():
        yield


@contextlib.contextmanager
def cuda_grouped_mm() -> Iterator[None]:
    """``torch._grouped_mm`` on CUDA takes fp32 and fp16 too, where its meta function (what a fake tensor
    runs) refuses them. aten/src/ATen/native/cuda/GroupedBlas.cpp ``_grouped_mm_cuda`` (torch 2.13) runs the
    CUTLASS kernel only for bf16 on sm90/sm100 and otherwise ``_grouped_mm_fallback``, which loops over the
    groups with ``mm_out`` into the one output tensor (no other allocation); torch/_meta_registrations.py
    ``_meta_grouped_mm_common`` checks for bf16 only. transformers' MoE experts call it with the weights'
    dtype (integrations/moe.py ``_grouped_mm``: ``input.to(weight.dtype)``), so fp32 weights under bf16 autocast
    (DDP, ZeRO-1/2 under bf16-mixed) reach it in fp32: every such sweep row stopped with 'Expected inputs of
    BF16 type'. While this is entered, a fake ``_grouped_mm`` of other dtypes returns the output the meta
    function would size (``_create_grouped_mm_output_tensor``) in the inputs' dtype; bf16 is left to the meta
    function. Backward (derivatives.yaml: two more ``_grouped_mm``) goes through the same rule."""
    import torch
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    grouped_mm = torch.ops.aten._grouped_mm.default

    def check(func: Any) -> bool:
        return func is grouped_mm

    def fallback(fake_mode: Any, func: Any, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None,
                 out_dtype: Any = None) -> Any:
        if bias is not None or (mat_a.dtype == mat_b.dtype == torch.bfloat16 and out_dtype in (None, torch.bfloat16)):
            return NotImplemented  # the meta function's own case
        with in_kernel_invocation_manager(fake_mode):
            out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
        return FakeTensor(fake_mode, out, mat_a.device)

    entry = (check, fallback)
    fake_impls.op_implementations_checks.append(entry)
    try:
        yield
    finally:
        fake_impls.op_implementations_checks.remove(entry)
