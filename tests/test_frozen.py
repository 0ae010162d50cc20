"""``validated_copy``: a changed copy of a frozen model goes through the model's validators."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from advisor.frozen import validated_copy
from advisor.training import TrainingConfig


def test_a_valid_change_is_kept_and_the_rest_carried_over():
    base = TrainingConfig(seq_len=1024, micro_batch_size=2, recipe="trainer")
    copy = validated_copy(base, {"seq_len": 4096})
    assert (copy.seq_len, copy.micro_batch_size, copy.recipe.name, copy.optimizer_implementation) == (
        4096, 2, "trainer", "fused")


def test_a_change_the_type_refuses_raises_where_model_copy_let_it_through():
    base = TrainingConfig(seq_len=1024, micro_batch_size=4, global_batch_size=32)
    assert base.model_copy(update={"global_batch_size": 2}).global_batch_size == 2  # pydantic does not check
    with pytest.raises(ValidationError, match="smaller than --micro-batch"):
        validated_copy(base, {"global_batch_size": 2})
    with pytest.raises(ValidationError):
        validated_copy(base, {"seq_len": -1})


def test_the_fields_given_stay_the_fields_given():
    """The plan's assumptions say "(default)" of what the user did not set: a copy must not mark every field."""
    base = TrainingConfig(seq_len=1024)
    copy = validated_copy(base, {"micro_batch_size": 2})
    assert copy.model_fields_set == {"seq_len", "micro_batch_size"}


def test_per_instance_remembers_by_identity_and_keeps_a_bounded_few():
    from advisor.frozen import PER_INSTANCE_ENTRIES, per_instance

    calls = []

    @per_instance
    def width(model):
        calls.append(model)
        return (model.micro_batch_size,)

    first = TrainingConfig(micro_batch_size=2)
    assert width(first) is width(first) and len(calls) == 1  # the same instance: asked once
    twin = TrainingConfig(micro_batch_size=2)
    assert width(twin) == width(first) and len(calls) == 2  # an equal copy is its own instance
    for size in range(1, PER_INSTANCE_ENTRIES + 2):  # the oldest entries give way
        width(TrainingConfig(micro_batch_size=size))
    width(first)
    assert len(calls) == 2 + PER_INSTANCE_ENTRIES + 1 + 1
