"""Activation checkpointing changes memory, not results: same loss and gradients, in one process."""

from __future__ import annotations

import pytest
import torch
from tests.wrappers._dist import global_batch, tiny_llama
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from wrappers.blocks import find_blocks
from wrappers.checkpointing import apply_activation_checkpointing
from wrappers.optim import canonical_param_name


def _loss_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids = global_batch(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {canonical_param_name(n): p.grad for n, p in model.named_parameters()}


def test_same_loss_and_gradients_with_checkpointing():
    plain, checkpointed = tiny_llama(), tiny_llama()
    wrappers = apply_activation_checkpointing(checkpointed, blocks=find_blocks(checkpointed))
    assert len(wrappers) == 2 and all(isinstance(w, CheckpointWrapper) for w in wrappers)
    assert list(checkpointed.model.layers) == wrappers
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    loss, grads = _loss_and_grads(plain)
    loss_ckpt, grads_ckpt = _loss_and_grads(checkpointed)
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=0)
    torch.testing.assert_close(grads_ckpt, grads, rtol=1e-6, atol=1e-8)


def test_key_value_cache_is_turned_off_with_a_warning():
    model = tiny_llama()
    model.config.use_cache = True
    with pytest.warns(UserWarning, match="use_cache"):
        apply_activation_checkpointing(model, blocks=find_blocks(model))
    assert model.config.use_cache is False


def test_no_blocks_warns_and_foreign_blocks_are_errors():
    model = tiny_llama()
    with pytest.warns(UserWarning, match="no blocks"):
        assert apply_activation_checkpointing(model, blocks=[]) == []
    with pytest.raises(ValueError, match="not submodules"):
        apply_activation_checkpointing(model, blocks=find_blocks(tiny_llama()))
