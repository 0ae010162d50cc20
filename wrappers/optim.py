"""Rebuild an optimizer on new parameters, keeping its class and every group's hyper-parameters.

Needed because ``torch.distributed.fsdp.fully_shard`` (FSDP2) replaces each ``nn.Parameter`` with a
new ``nn.Parameter`` wrapping a ``DTensor`` shard (``FSDPParam._init_sharded_param`` registers
``self.sharded_param`` on the module), so an optimizer built before sharding points at tensors the
model no longer uses. DDP and ``model.to(device)`` keep parameter identity and need no rebuild.

Parameters are matched by name. Names come from the groups' ``param_names`` when the optimizer was
built from ``model.named_parameters()`` (PyTorch >= 2.6 keeps them), or from ``param_group_names``
called on the model before it was wrapped. Wrapper prefixes (activation checkpointing, DDP,
``torch.compile``) are stripped before matching, so names survive wrapping.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX

# Prefixes wrappers put into parameter names: checkpoint_wrapper (inner), torch.compile, DDP/DP (outer).
_INNER_PREFIXES = (_CHECKPOINT_PREFIX, "_orig_mod.")
_OUTER_PREFIX = "module."


def canonical_param_name(name: str) -> str:
    """``name`` without the components added by checkpoint_wrapper, ``torch.compile`` and DDP."""
    for prefix in _INNER_PREFIXES:
        name = name.replace(prefix, "")
    return name.removeprefix(_OUTER_PREFIX)


def constructor_kwargs(optimizer_class: type[torch.optim.Optimizer], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``settings`` (``optimizer.defaults`` or a param group) the class's constructor accepts.

    ``defaults`` can hold keys the constructor does not take (AdamW records
    ``decoupled_weight_decay=True`` but does not accept it), so they are filtered by signature.
    """
    accepted = set(inspect.signature(optimizer_class.__init__).parameters) - {"self", "params"}
    return {key: value for key, value in settings.items() if key in accepted}


def optimizer_implementation(optimizer: torch.optim.Optimizer | None) -> str | None:
    """How ``optimizer`` steps, read from its ``defaults`` (torch/optim/adam.py): ``fused=True`` runs the
    fused kernel, ``foreach=True`` the multi-tensor one, ``foreach=False`` the per-tensor loop. None
    where neither flag was set (torch then picks foreach on CUDA, the torch recipe's default) or where
    the optimizer has no such flags."""
    if optimizer is None:
        return None
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    foreach = defaults.get("foreach")
    if foreach is None:
        return None
    return "foreach" if foreach else "for-loop"


def param_group_names(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[list[str]]:
    """Canonical names of each group's parameters, looked up in ``model`` by identity.

    Call it before wrapping the model. A parameter the model does not hold is a ``ValueError``.
    """
    names = {id(p): canonical_param_name(n) for n, p in model.named_parameters()}
    out: list[list[str]] = []
    for index, group in enumerate(optimizer.param_groups):
        unknown = sum(id(p) not in names for p in group["params"])
        if unknown:
            raise ValueError(f"optimizer param group {index} has {unknown} parameters that are not in the model")
        out.append([names[id(p)] for p in group["params"]])
    return out


def rebuild_optimizer(
    old_optimizer: torch.optim.Optimizer,
    new_params: Mapping[str, nn.Parameter] | Iterable[tuple[str, nn.Parameter]],
    *,
    group_param_names: Sequence[Sequence[str]] | None = None,
) -> torch.optim.Optimizer:
    """A new optimizer of ``old_optimizer``'s class over ``new_params`` (name -> parameter).

    Each param group keeps its hyper-parameters (``lr``, ``weight_decay``, ``foreach``...). Groups
    are matched by canonical parameter name: ``group_param_names`` when given, else the groups'
    ``param_names``. Without names, one group (or several with equal settings) takes every new
    parameter that requires a gradient; several groups with different settings cannot be mapped,
    so a warning is issued and the first group's settings apply to all. Optimizer state is not
    carried over (it would be the wrong shape after sharding); a warning says so if there was any.
    """
    new = {canonical_param_name(name): p for name, p in dict(new_params).items()}
    groups = old_optimizer.param_groups
    cls = type(old_optimizer)
    if old_optimizer.state:
        warnings.warn("rebuild_optimizer: the old optimizer's state is dropped", stacklevel=2)
    names = group_param_names
    if names is None and all("param_names" in g for g in groups):
        names = [[canonical_param_name(n) for n in g["param_names"]] for g in groups]
    if names is not None:
        if len(names) != len(groups):
            raise ValueError(f"{len(names)} name lists for {len(groups)} param groups")
        missing = sorted({n for group in names for n in group} - set(new))
        if missing:
            raise ValueError(f"parameters not found after wrapping: {', '.join(missing[:5])}")
        new_groups = [
            {"params": [(n, new[n]) for n in group_names], **constructor_kwargs(cls, group)}
            for group_names, group in zip(names, groups)
        ]
    else:
        settings = [constructor_kwargs(cls, g) for g in groups]
        if any(s != settings[0] for s in settings[1:]):
            warnings.warn(
                f"rebuild_optimizer: {len(groups)} param groups with different settings cannot be mapped "
                "without parameter names; the first group's settings apply to every parameter",
                stacklevel=2,
            )
        new_groups = [{"params": [(n, p) for n, p in new.items() if p.requires_grad], **settings[0]}]
    return cls(new_groups, **constructor_kwargs(cls, old_optimizer.defaults))
