"""CUDA's autocast fp32 policy for CPU autocast, while the simulator runs.

``torch.autocast`` keeps one op list per device (aten/src/ATen/autocast_mode.cpp). On CUDA,
``pow``, ``exp``, ``rsqrt``, ``softmax``, ``log_softmax``, ``layer_norm``, ``sum``... run in fp32
(their bf16 inputs are cast up, so autograd saves fp32 tensors); on the CPU they run in the input's
dtype. GPT-2's ``gelu_new`` (``0.5*x*(1+tanh(...x + 0.044715*pow(x, 3)))``) is the case that
matters: on a GPU its intermediates are fp32. The matmul-like ops CUDA runs in bf16 (``linear``,
``matmul``, ``bmm``, ``addmm``, ``baddbmm``, ``scaled_dot_product_attention``) are in the CPU list
too, so only the fp32 side needs changing.

``cuda_fp32_policy()`` registers, for the duration of a ``with`` block, an ``AutocastCPU`` kernel
for each op below that casts bf16/fp16 floating inputs to fp32 and redispatches with autocast
excluded: what CUDA's ``WrapFunction<CastPolicy::fp32, ...>`` does. The registrations are removed
on exit.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

# CUDA's ``fp32`` and ``fp32_set_opt_dtype`` lists (autocast_mode.cpp, AutocastCUDA), restricted to
# ops a transformer's forward can reach and that CPU autocast does not already run in fp32.
CUDA_FP32_OPS = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "group_norm", "logsumexp", "softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum",
    "cumprod", "prod",
)


@contextlib.contextmanager
def cuda_fp32_policy() -> Iterator[None]:
    import torch
    from torch.utils._pytree import tree_map_only

    low = (torch.bfloat16, torch.float16)
    autocast_cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def up(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32) if t.dtype in low and t.device.type == "cpu" else t

    def kernel_for(op: torch._ops.OpOverload):
        def kernel(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(autocast_cpu):
                return op(*tree_map_only(torch.Tensor, up, args), **tree_map_only(torch.Tensor, up, kwargs))

        return kernel

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel" for a few ops
        for name in CUDA_FP32_OPS:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            lib.impl(name, kernel_for(op), "AutocastCPU")
    try:
        yield
    finally:
        lib._destroy()
