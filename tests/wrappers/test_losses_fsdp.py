"""The fused loss on Phi (partial rotary embeddings, a head with a bias) under ZeRO-3 (FSDP2) with activation
checkpointing, for real: 2 gloo ranks on CPU against one process training with transformers' own loss. The
sweep's two phi zero3 + checkpointing errors (efff7a7491b9, 50be143cb286) were configs whose rotary width is odd,
which transformers cannot run on one CPU either (advisor.model.config_keys refuses them); a Phi that transformers
runs trains under this recipe, its head's bias sharded by FSDP2 and its gradient from the kernel."""

from __future__ import annotations

import pytest
import torch
from tests.wrappers._dist import global_batch, rank_batch, reference_params, run_distributed

from wrappers.losses import use_loss_kernel

NUM_STEPS = 1


def tiny_phi(seed: int = 0) -> torch.nn.Module:
    """A 2-block Phi, head_dim 16 x partial_rotary_factor 0.5 = 8 rotated dimensions, a non-zero head bias."""
    from transformers import PhiConfig, PhiForCausalLM

    config = PhiConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, partial_rotary_factor=0.5,
                       resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, use_cache=False,
                       tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = PhiForCausalLM(config)
    torch.nn.init.normal_(model.lm_head.bias, std=0.5)
    return model


def _sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.5)


def _worker(rank: int, world_size: int) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from wrappers.recipe import Recipe, apply_recipe

    expected = reference_params(NUM_STEPS, model_fn=tiny_phi, optimizer_fn=_sgd)
    model = use_loss_kernel(tiny_phi(), "fused")
    applied = apply_recipe(model, Recipe(strategy="zero3", checkpointing="on"), device="cpu", optimizer=_sgd(model))
    for step in range(NUM_STEPS):
        ids = rank_batch(step, rank, world_size)
        out = applied.model(input_ids=ids, labels=ids)
        assert out.logits is None  # the kernel ran
        out.loss.backward()
        applied.optimizer.step()
        applied.optimizer.zero_grad()
    state = get_model_state_dict(applied.model, options=StateDictOptions(full_state_dict=True))
    moved = (expected["lm_head.bias"] - tiny_phi().lm_head.bias.detach()).abs().max()
    assert moved > 1e-3  # the bias trained, so its gradient is checked below
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name].float(), tensor, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_fused_loss_on_phi_under_zero3_with_checkpointing_matches_one_process():
    pytest.importorskip("transformers")
    assert global_batch(0).shape[0] % 2 == 0
    run_distributed(_worker)
