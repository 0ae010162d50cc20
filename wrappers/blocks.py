"""Find a model's repeated blocks: the units that FSDP shards and activation checkpointing wraps.

Only model structure belongs here; what is done to the blocks lives in ``fsdp.py`` and
``checkpointing.py``.

The rule, in order:

1. Hugging Face models name their block classes in ``_no_split_modules`` (the same list
   ``accelerate`` uses for ``device_map``); every outermost module of one of those classes is a block.
2. Otherwise the heuristic: the ``nn.ModuleList`` whose children are all of one class (at least two)
   and that holds the most parameters is the block list, provided it holds more than half of the
   model's parameters (a transformer's layer stack does; an embedding table or a head does not).
3. Otherwise there are no blocks: the caller shards or checkpoints the root alone.

A block already wrapped for activation checkpointing (``CheckpointWrapper``) is returned as its
wrapper, so that FSDP shards the wrapper, as torchtitan does (``apply_ac`` before ``apply_fsdp``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

# A ModuleList is the block stack only if it holds more than this share of all parameters.
MIN_BLOCK_PARAM_SHARE = 0.5


def block_class_names(model: nn.Module) -> list[str]:
    """Class names of the blocks of ``model`` (sorted, unique); empty when it has none."""
    return sorted({type(_unwrap(block)).__name__ for block in find_blocks(model)})


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model`` in module order, by the rule in this module's docstring."""
    blocks = _blocks_by_class_name(model, set(getattr(model, "_no_split_modules", None) or ()))
    if not blocks:
        blocks = _blocks_by_module_list(model)
    wrappers = {id(m._checkpoint_wrapped_module): m for m in model.modules() if isinstance(m, CheckpointWrapper)}
    return [wrappers.get(id(block), block) for block in blocks]


def _unwrap(module: nn.Module) -> nn.Module:
    return module._checkpoint_wrapped_module if isinstance(module, CheckpointWrapper) else module


def _blocks_by_class_name(model: nn.Module, class_names: set[str]) -> list[nn.Module]:
    """Outermost modules whose class is named in ``class_names`` (nested matches are inside a block)."""
    if not class_names:
        return []
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in class_names and module is not model:
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def _blocks_by_module_list(model: nn.Module) -> list[nn.Module]:
    total = sum(p.numel() for p in model.parameters())
    best: list[nn.Module] = []
    best_numel = 0
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(_unwrap(child)) for child in module}) != 1:
            continue
        numel = sum(p.numel() for p in module.parameters())
        if numel > best_numel:
            best, best_numel = list(module), numel
    return best if total and best_numel > MIN_BLOCK_PARAM_SHARE * total else []

