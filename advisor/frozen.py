"""Copies of frozen pydantic models that are validated like the original.

``model.model_copy(update=...)`` skips validation: a copy could carry a value its type refuses (a
negative micro-batch, a global batch below the micro-batch, an unknown precision) and every layer
downstream would trust it. ``validated_copy`` builds the copy through the model's own validators.
"""

from __future__ import annotations

from collections.abc import Mapping
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
