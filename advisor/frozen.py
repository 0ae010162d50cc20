"""Copies of frozen pydantic models that are validated like the original, and their dumps in a fixed key order.

``model.model_copy(update=...)`` skips validation: a copy could carry a value its type refuses (a
negative micro-batch, a global batch below the micro-batch, an unknown precision) and every layer
downstream would trust it. ``validated_copy`` builds the copy through the model's own validators.

A derived value is a property (a pydantic ``computed_field`` where the JSON carries it), and pydantic writes
computed fields after the stored ones; ``in_json_order`` puts a dump's keys back in the order ``--json``
readers have always seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])
PER_INSTANCE_ENTRIES = 32  # argument tuples ``per_instance`` keeps: a plan's spec, LoRA and remedies' variants


def validated_copy(model: M, update: Mapping[str, Any]) -> M:
    """``model`` with the fields in ``update`` replaced, validated as a new instance of its type. The fields
    the original was given explicitly stay the ones marked as given (plus ``update``'s), as ``model_copy``
    keeps them: the plan's assumptions say "(default)" of every field the user did not set."""
    copy = type(model).model_validate({**model.__dict__, **update})
    object.__setattr__(copy, "__pydantic_fields_set__", set(model.model_fields_set) | set(update))
    return copy


def in_json_order(data: Any, keys: Sequence[str]) -> Any:
    """``data`` (a model's dump) with ``keys`` first, in that order (those present), then the others as they
    came; anything but a dict is returned as it is (for a ``model_serializer(mode="wrap")``)."""
    if not isinstance(data, dict):
        return data
    return {**{key: data[key] for key in keys if key in data}, **data}


def per_instance(fn: F) -> F:
    """``fn`` of frozen models (or None) remembered by the identity of its arguments: the planner asks the same
    spec's shape hundreds of times a plan, and a frozen model's value cannot change under it. A few recent argument
    tuples are kept (with the arguments themselves, so no identity is reused while remembered)."""
    memo: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = {}

    @functools.wraps(fn)
    def remembered(*args: Any) -> Any:
        key = tuple(map(id, args))
        hit = memo.get(key)
        if hit is not None:
            return hit[1]
        value = fn(*args)
        if len(memo) >= PER_INSTANCE_ENTRIES:
            memo.pop(next(iter(memo)))
        memo[key] = (args, value)
        return value

    return remembered  # type: ignore[return-value]
