"""The offloading hooks (``wrappers.activation_offload``) on real tensors: copied out and back, the step's
gradients are those of the step without them, and under checkpointing what they move is each block's input
(plus the final norm's tensors). CPU tensors stand in for a GPU's (``devices=("cpu",)``). CPU only."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from wrappers.activation_offload import apply_activation_offload, model_body
from wrappers.blocks import find_blocks
from wrappers.checkpointing import apply_activation_checkpointing

pytestmark = pytest.mark.filterwarnings("ignore")

CFG = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=128, max_position_embeddings=256)


def _grads(offload: bool, checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG))
    if checkpointing:
        apply_activation_checkpointing(model, blocks=find_blocks(model))
    hooks = apply_activation_offload(model, devices=("cpu",)) if offload else None
    ids = torch.randint(0, 128, (2, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, hooks.offloaded_bytes if hooks else 0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_are_those_of_the_plain_step(checkpointing):
    plain, _ = _grads(False, checkpointing)
    moved, nbytes = _grads(True, checkpointing)
    assert nbytes > 0
    for name, grad in plain.items():
        torch.testing.assert_close(moved[name], grad, rtol=0, atol=0, msg=name)


def test_under_checkpointing_each_block_input_leaves():
    """Three fp32 block inputs of 2 x 64 x 64 x 4 = 32,768 bytes; the final norm's three fp32 tensors of that size
    (its input, saved by pow and by the product with 1/rms, and the normalised tensor the weight multiplies), its
    1/rms (512 bytes, twice) kept under the 1,024-byte threshold; the embedding's indices (2 x 64 x 8 = 1,024
    bytes). The head, outside the body, keeps its input on the device."""
    _, nbytes = _grads(True, True)
    assert nbytes == 1_024 + 3 * 32_768 + 3 * 32_768


def test_the_body_is_the_decoder():
    model = LlamaForCausalLM(LlamaConfig(**CFG))
    assert model_body(model) is model.model


def test_wrap_applies_the_hooks_on_the_data_parallel_path():
    """One process, no GPU: wrap() hands back the model with the hooks around its body (on a CPU they move
    nothing: only a GPU's tensors go to host memory) and its blocks checkpointed, as offloading is planned; the
    step runs."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from wrappers.wrap import wrap

    model = wrap(LlamaForCausalLM(LlamaConfig(**CFG)), activation_offload=True, verbose=False)
    assert len(model.model._forward_pre_hooks) == 1 and len(model.model._forward_hooks) == 1
    assert model.advisor_decision.checkpointing == "on"
    assert all(isinstance(block, CheckpointWrapper) for block in find_blocks(model))
    ids = torch.randint(0, 128, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_wrap_refuses_it_on_a_mesh_and_without_checkpointing():
    from wrappers.wrap import wrap

    with pytest.raises(ValueError, match="activation_offload=True.*data-parallel path only"):
        wrap(LlamaForCausalLM(LlamaConfig(**CFG)), activation_offload=True, tp=2, verbose=False)
    with pytest.raises(ValueError, match="activation_offload=True is planned under activation checkpointing"):
        wrap(LlamaForCausalLM(LlamaConfig(**CFG)), activation_offload=True, activation_checkpointing="off",
             verbose=False)
