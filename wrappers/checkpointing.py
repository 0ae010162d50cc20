"""Activation checkpointing of whole blocks: recompute each block's activations in backward.

One mechanism for every model: PyTorch's generic ``checkpoint_wrapper`` with
``CheckpointImpl.NO_REENTRANT`` (``torch.utils.checkpoint.checkpoint(use_reentrant=False)``), applied
through ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing``,
the same call torchtitan and FSDP's own tests use. Hugging Face's ``gradient_checkpointing_enable`` is
not used, so a model from anywhere is treated alike. Apply it before ``fully_shard`` (torchtitan
order): FSDP then shards the wrapper and its recomputation re-gathers the block's parameters.

Which modules are blocks is decided in ``blocks.py``. ``requested_mode`` reads ``wrap()``'s
``activation_checkpointing`` argument once into the one spelling, ``advisor.training.CheckpointMode``;
``apply_requested_checkpointing`` applies it on the paths that apply no recipe (one process, and
accelerate's ``prepare``) and returns the mode applied, for the decision to report.

``selective=True`` keeps some op outputs instead of recomputing them, with torchtitan's per-op policy
(``torchtitan/models/llama3/infra/parallelize.py``, ``_apply_ac_to_transformer_block``): the outputs
of every attention kernel and of every other matrix product of a block (the 1st, 3rd, 5th, ...: q,
v, gate and down in a Llama block) are saved, everything else is recomputed; through
``torch.utils.checkpoint.create_selective_checkpoint_contexts``.
"""

from __future__ import annotations

import functools
import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as _ckpt

from advisor.training import CheckpointMode
from wrappers.blocks import find_blocks

_MODES: dict[object, CheckpointMode] = {True: "on", False: "off", "on": "on", "off": "off", "selective": "selective"}


def _attention_ops() -> set:
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(torch.ops.aten, name).default for name in names if hasattr(torch.ops.aten, name)}


def selective_context():
    """One block's forward and recompute contexts: save attention outputs and every other mm."""
    counts: dict[str, int] = defaultdict(int)
    attention = _attention_ops()

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
            return CheckpointPolicy.MUST_SAVE if counts[mode] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in attention else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(model: nn.Module, *, blocks: Sequence[nn.Module],
                                   selective: bool = False) -> list[nn.Module]:
    """Wrap each of ``blocks`` (submodules of ``model``) in a non-reentrant ``CheckpointWrapper``.

    The wrappers replace the blocks in their parents, in place. Parameter names gain a
    ``_checkpoint_wrapped_module.`` component, which ``state_dict()`` and
    ``torch.distributed.checkpoint`` strip again. A Hugging Face model's ``config.use_cache`` is
    turned off (with a warning): a key/value cache would be appended to twice, once in the forward
    and once in the recomputation (``transformers`` does the same in ``gradient_checkpointing_enable``).

    Returns the wrappers, in the order of ``blocks``.
    """
    if not blocks:
        warnings.warn("activation checkpointing requested but the model has no blocks; not applied", stacklevel=2)
        return []
    block_ids = {id(block) for block in blocks}
    missing = block_ids - {id(m) for m in model.modules()}
    if missing:
        raise ValueError(f"{len(missing)} of the blocks are not submodules of the model")
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        warnings.warn("activation checkpointing: setting model.config.use_cache=False", stacklevel=2)
        config.use_cache = False
    extra = {"context_fn": selective_context} if selective else {}
    wrapper_fn = functools.partial(_ckpt.checkpoint_wrapper, checkpoint_impl=_ckpt.CheckpointImpl.NO_REENTRANT, **extra)
    _ckpt.apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=wrapper_fn, check_fn=lambda module: id(module) in block_ids
    )
    wrappers = {
        id(m._checkpoint_wrapped_module): m for m in model.modules() if isinstance(m, _ckpt.CheckpointWrapper)
    }
    return [wrappers[id(block)] for block in blocks]


def turn_off_kv_cache(model: Any) -> None:
    """Set a Hugging Face model's (or config's) ``use_cache`` to False, as HF Trainer does for training
    (``config.use_cache = TrainingArguments.use_cache``, False by default). Left on, the forward builds a
    ``DynamicCache`` in training: under autocast over fp32 weights it holds an fp32 copy of every layer's
    keys and values through the loss (SDPA saves bf16 casts), and under torch's checkpoint_wrapper it lives
    to the last block's backward (``advisor.estimate.kv_cache``). ``generate()`` passes its own
    ``use_cache`` and is unaffected."""
    config = model if hasattr(model, "use_cache") and not isinstance(model, nn.Module) else getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        config.use_cache = False


def requested_mode(asked: bool | CheckpointMode | None) -> CheckpointMode | None:
    """``wrap(activation_checkpointing=...)`` as a mode: ``True`` / ``"on"`` full, ``"selective"``, ``False`` /
    ``"off"`` none; None: not asked (the plan decides). ValueError for anything else."""
    if asked is None:
        return None
    if isinstance(asked, (bool, str)) and asked in _MODES:
        return _MODES[asked]
    raise ValueError(f"activation_checkpointing={asked!r}: expected True, False, 'on', 'off' or 'selective'")


def apply_requested_checkpointing(model: nn.Module, asked: CheckpointMode | None) -> CheckpointMode:
    """Checkpoint ``model``'s blocks as ``asked`` (``"on"``: full, ``"selective"``, ``None`` / ``"off"``:
    nothing). Returns the mode applied: ``"off"`` for a model without blocks (``apply_activation_checkpointing``
    warns)."""
    if asked in (None, "off"):
        return "off"
    applied = apply_activation_checkpointing(model, blocks=find_blocks(model), selective=asked == "selective")
    return asked if applied else "off"
