"""The optimizer step's temporaries by implementation (``advisor.estimate.states``), worked by hand
on a tiny Llama: fused allocates none, foreach one second-moment-sized temporary, for-loop two of the
largest trainable tensor (its local shard under FSDP2). The simulator's check is in
tests/simulate/test_optimizer_impl.py."""

from __future__ import annotations

import pytest

from advisor.estimate.memory import model_states
from advisor.model.lora import with_lora
from advisor.model.sources import spec_from_config
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=176,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            max_position_embeddings=1024, tie_word_embeddings=False, _name_or_path="tiny-llama")
# Per block: q 64x64, k 64x32, v 64x32, o 64x64, gate/up/down 3 x 64x176, two norms of 64.
BLOCK = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176 + 2 * 64  # 46,208
PARAMS = 2 * 512 * 64 + 2 * BLOCK + 64  # embedding and head, two blocks, final norm: 158,016
EMBEDDING = 512 * 64  # the largest tensor: 32,768


def _temp(impl: str, strategy: str, world: int, **training) -> int:
    config = TrainingConfig(optimizer_impl=impl, **training)
    spec = spec_from_config(TINY, name="tiny", source="local")
    if config.lora is not None:
        spec = with_lora(spec, config.lora)
    return model_states(spec, config, get_strategy(strategy).on(config.engine), world).step_temporary


def test_tiny_llama_count_is_the_hand_count():
    assert spec_from_config(TINY, name="tiny", source="local").total_params == PARAMS == 158_016


@pytest.mark.parametrize("strategy, world, foreach, for_loop", [
    ("ddp", 2, 4 * PARAMS, 2 * 4 * EMBEDDING),
    ("zero2", 2, 4 * PARAMS // 2, 2 * 4 * EMBEDDING // 2),
    ("zero3", 4, 4 * PARAMS // 4, 2 * 4 * EMBEDDING // 4),
])
def test_step_temporary_by_implementation(strategy, world, foreach, for_loop):
    assert _temp("fused", strategy, world) == 0
    assert _temp("foreach", strategy, world) == foreach
    assert _temp("for-loop", strategy, world) == for_loop


def test_for_loop_under_lora_is_the_widest_adapter():
    """r=8 on q_proj and v_proj: lora_A 8x64 and lora_B 64x8 (q), 32x8 (v): the largest holds 512."""
    assert _temp("for-loop", "ddp", 2, lora=8) == 2 * 4 * 8 * 64


def test_recipe_sets_the_implementation_unless_given():
    assert TrainingConfig().optimizer_implementation == "foreach"
    assert TrainingConfig(recipe="trainer").optimizer_implementation == "fused"
    assert TrainingConfig(recipe="trainer", optimizer_impl="for-loop").optimizer_implementation == "for-loop"


@pytest.mark.parametrize("strategy, world, precision, temp", [
    ("ddp", 2, "bf16-mixed", 2 * 4 * EMBEDDING),  # the fp32 update and the next expression's result
    ("zero1", 2, "bf16-mixed", 2 * 4 * EMBEDDING),  # ZeroRedundancyOptimizer never splits a tensor
    ("ddp", 2, "bf16", (2 + 2) * 4 * EMBEDDING),  # and grad.float(), p.float() of the bf16 gradient and parameter
])
def test_adafactor_steps_one_tensor_at_a_time(strategy, world, precision, temp):
    """transformers' Adafactor loops over the parameters in Python (optimization.py Adafactor.step): the largest
    tensor's temporaries, not a copy of every parameter (the H200's BERT-large run with Adafactor under fp16 and
    checkpointing peaked 16.9% below the estimate that counted every parameter: benchmarks/results/gpu_stacks.md)."""
    assert _temp("fused", strategy, world, optimizer="adafactor", precision=precision) == temp


def test_adafactor_under_deepspeed_steps_the_flat_partition():
    """DeepSpeed hands a client optimizer each rank's flat fp32 partition, one tensor: Adafactor's two fp32
    temporaries are that partition's size, not the largest parameter's. ZeRO-2 over 2 ranks, E = PARAMS / 2
    elements a partition: ZeRO's fp32 cast of the flat gradient (4E) and Adafactor's two temporaries (2 x 4E),
    less the bf16 partition freed once cast (2E): 10E."""
    assert _temp("fused", "zero2", 2, optimizer="adafactor", engine="deepspeed") == (4 + 2 * 4 - 2) * PARAMS // 2


def test_adafactor_under_deepspeed_keeps_the_whole_second_moment():
    """On a flat 1-D partition Adafactor cannot factor (transformers' _get_options: two or more dims): bf16-mixed
    ZeRO-2 over 2 ranks holds the fp32 master and a full fp32 second moment, (4 + 4) x PARAMS / 2, where the torch
    engine's per-parameter tensors keep a row and a column per matrix."""
    config = TrainingConfig(optimizer="adafactor", engine="deepspeed")
    spec = spec_from_config(TINY, name="tiny", source="local")
    states = model_states(spec, config, get_strategy("zero2").on("deepspeed"), 2)
    assert states.optimizer == (4 + 4) * PARAMS // 2
