"""FSDP2 over more ranks than MoE experts: ``wrap()`` shards the stacked experts on dim 1 (torchtitan's rule,
``wrappers.fsdp.expert_placement_fn``) and trains like one process. Four gloo ranks, a tiny Mixtral of 2 experts."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tests.wrappers._dist import (
    VOCAB, assert_params_close, batch_loader, build_adamw, collect_distributed, launch_env, reference_params,
    train_steps,
)
from wrappers import wrap

WORLD, NUM_STEPS, HIDDEN, INTER = 4, 2, 32, 24


def tiny_mixtral() -> torch.nn.Module:
    """2 layers of 2 experts (both active), hidden 32, expert width 24: gate_up_proj (2, 48, 32), down_proj (2, 32, 24)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=2, vocab_size=VOCAB,
                           max_position_embeddings=64, use_cache=False, tie_word_embeddings=False)
    torch.manual_seed(0)
    return MixtralForCausalLM(config)


def _train(rank: int, world_size: int, expected: dict) -> dict:
    model = tiny_mixtral()
    model, optimizer, loader = wrap(model, build_adamw(model), batch_loader(NUM_STEPS, world_size), strategy="zero3",
                                    env=launch_env(rank, world_size), verbose=False)
    shards = {name: (tuple(p.to_local().shape), str(p.placements[0])) for name, p in model.named_parameters()
              if name.endswith(("experts.gate_up_proj", "experts.down_proj", "gate.weight"))}
    train_steps(model, optimizer, (ids for (ids,) in loader))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    max_diff = assert_params_close({name: state[name] for name in expected}, expected, rtol=1e-4, atol=1e-5)
    return {"shards": shards, "max_diff": max_diff}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    expected = reference_params(NUM_STEPS, model_fn=tiny_mixtral)
    return collect_distributed(_train, expected, world_size=WORLD, timeout_s=120)


def test_experts_shard_on_dim1_and_train_like_one_process(results):
    print(f"zero3 over 2 experts on 4 ranks: max |diff| {max(r['max_diff'] for r in results):.2e}")
    shards = [r["shards"] for r in results]
    # 2 experts over 4 ranks: Shard(0) would leave ranks 2 and 3 empty and pad each tensor to 4 experts.
    # On dim 1 every rank holds both experts and a quarter of the rows: 48 / 4 = 12, 32 / 4 = 8.
    for rank_shards in shards:
        for layer in (0, 1):
            prefix = f"model.layers.{layer}.mlp."
            assert rank_shards[prefix + "experts.gate_up_proj"] == ((2, 12, HIDDEN), "S(1)")
            assert rank_shards[prefix + "experts.down_proj"] == ((2, 8, INTER), "S(1)")
            # The router's (2, 32) weight is no stacked expert: dim 0, one row on ranks 0 and 1, none on 2 and 3.
            assert rank_shards[prefix + "gate.weight"][1] == "S(0)"
    assert [s["model.layers.0.mlp.gate.weight"][0] for s in shards] == [(1, HIDDEN), (1, HIDDEN), (0, HIDDEN),
                                                                         (0, HIDDEN)]
