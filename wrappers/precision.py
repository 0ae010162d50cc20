"""What a precision means for live tensors, and how a plain training loop gets it.

The facts (parameter dtype, compute dtype, mixed or not) are ``advisor.precision``'s table; this
module only turns its dtype names into torch dtypes (``getattr(torch, name)``), so the planner and
the wrappers cannot disagree.

Mixed precision under DP, DDP and ZeRO-1 is ``torch.autocast`` around the model's forward
(``apply_autocast``). It is entered by forward hooks registered on the model itself, not by a
bound ``forward`` stored on it: ``DataParallel`` replicates the model each step by copying its
``__dict__`` (``Module._replicate_for_data_parallel``), so a stored bound method would make every
replica run the original module's weights, while hooks are called with the replica. Autocast is
entered inside the replica's own call because autocast state, dtype included, is per thread:
``parallel_apply`` re-enters autocast in its worker threads with the device's default dtype
(float16 on CUDA), which would turn bf16-mixed into fp16 if autocast were entered only around the
outer ``DataParallel``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import torch
from torch import nn

from advisor.precision import PRECISIONS, Precision, precision_info


class PrecisionDtypes(NamedTuple):
    """Parameter dtype and autocast dtype (None: no autocast, the model computes in its own dtype)."""

    param_dtype: torch.dtype
    compute_dtype: torch.dtype | None


def precision_dtypes(precision: Precision) -> PrecisionDtypes:
    """The torch dtypes of ``advisor.precision``'s row; ``ValueError`` for an unknown name."""
    info = precision_info(precision)
    return PrecisionDtypes(getattr(torch, info.param_dtype), getattr(torch, info.compute_dtype) if info.mixed else None)


def precision_named(param_dtype: torch.dtype, compute_dtype: torch.dtype | None) -> Precision:
    """The precision whose dtypes these are (the inverse of ``precision_dtypes``); ``ValueError`` if none."""
    for name in PRECISIONS:
        if precision_dtypes(name) == (param_dtype, compute_dtype):
            return name
    raise ValueError(f"no precision stores parameters in {param_dtype} and autocasts to {compute_dtype}")


def autocast_context(precision: Precision, device_type: str, *, cache_enabled: bool = True
                     ) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, dtype)`` for a mixed precision, else ``contextlib.nullcontext()``;
    ``cache_enabled=False`` as Lightning's precision plugin enters it (its recipe's ``autocast_cache``)."""
    compute = precision_dtypes(precision).compute_dtype
    if compute is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=compute, cache_enabled=cache_enabled)


class _AutocastHooks:
    """A forward pre-hook that enters autocast and a forward hook that leaves it, per thread.

    The open contexts are kept per thread id in a plain dict (not ``threading.local``), so that a
    model carrying the hooks can still be deep-copied or pickled (an EMA copy, ``torch.save``).
    """

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type, self.dtype = device_type, dtype
        self._open: dict[int, list] = {}  # DataParallel runs replicas in threads: one stack each

    def enter(self, module: nn.Module, args: tuple) -> None:
        context = torch.autocast(self.device_type, dtype=self.dtype)
        context.__enter__()
        self._open.setdefault(threading.get_ident(), []).append(context)

    def leave(self, module: nn.Module, args: tuple, output: object) -> None:
        stack = self._open[threading.get_ident()]
        stack.pop().__exit__(None, None, None)
        if not stack:
            del self._open[threading.get_ident()]


def apply_autocast(module: nn.Module, precision: Precision, device_type: str) -> nn.Module:
    """Run ``module``'s forward (and every DataParallel replica's) under autocast for a mixed precision.

    No-op for ``fp32`` and pure ``bf16``. Register it on the module that holds the weights, before
    or after wrapping it in DDP or DataParallel: both call it. Returns ``module``.
    """
    compute = precision_dtypes(precision).compute_dtype
    if compute is None or autocast_dtype(module) == compute:
        return module
    hooks = _AutocastHooks(device_type, compute)
    module.register_forward_pre_hook(hooks.enter)
    module.register_forward_hook(hooks.leave, always_call=True)  # leave autocast even if forward raises
    return module


def autocast_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype ``apply_autocast`` makes ``module``'s forward run under, None when it does not."""
    for hook in module._forward_pre_hooks.values():
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, _AutocastHooks):
            return owner.dtype
    return None
