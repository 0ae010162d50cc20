"""Activation checkpointing of whole blocks: recompute each block's activations in backward.

One mechanism for every model: PyTorch's generic ``checkpoint_wrapper`` with
``CheckpointImpl.NO_REENTRANT`` (``torch.utils.checkpoint.checkpoint(use_reentrant=False)``), applied
through ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing``,
the same call torchtitan and FSDP's own tests use. Hugging Face's ``gradient_checkpointing_enable`` is
not used, so a model from anywhere is treated alike. Apply it before ``fully_shard`` (torchtitan
order): FSDP then shards the wrapper and its recomputation re-gathers the block's parameters.

Which modules are blocks is decided in ``blocks.py``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

from torch import nn
from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as _ckpt


def apply_activation_checkpointing(model: nn.Module, *, blocks: Sequence[nn.Module]) -> list[nn.Module]:
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
    wrapper_fn = functools.partial(_ckpt.checkpoint_wrapper, checkpoint_impl=_ckpt.CheckpointImpl.NO_REENTRANT)
    _ckpt.apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=wrapper_fn, check_fn=lambda module: id(module) in block_ids
    )
    wrappers = {
        id(m._checkpoint_wrapped_module): m for m in model.modules() if isinstance(m, _ckpt.CheckpointWrapper)
    }
    return [wrappers[id(block)] for block in blocks]
