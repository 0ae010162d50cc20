"""Copies of frozen pydantic models that are validated like the original, and their dumps in a fixed key order.

``model.model_copy(update=...)`` skips validation: a copy could carry a value its type refuses (a
negative micro-batch, a global batch below the micro-batch, an unknown precision) and every layer
downstream would trust it. ``validated_copy`` builds the copy through the model's own validators.

A derived value is a property (a pydantic ``computed_field`` where the JSON carries it), and pydantic writes
computed fields after the stored ones; ``in_json_order`` puts a dump's keys back in the order ``--json``
readers have always seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


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
