"""The FSDP1 simulated step (``advisor.simulate.fsdp1_step``): accelerate's FSDP1 wrapping runs on a fake
process group with real CPU tensors, and its measured moments hold what torch's FSDP1 source says they hold.
CPU only, no network."""

from __future__ import annotations

import warnings

import pytest

from advisor.training import TrainingConfig

# Untied tiny Llama: hidden 64, 2 blocks, vocabulary 8,192. Root unit (embedding, head, final norm):
# 2 x 8,192 x 64 + 64 = 1,048,640 parameters.
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=176,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=8192,
            max_position_embeddings=1024, tie_word_embeddings=False, _name_or_path="tiny-llama-8k")


def test_the_states_and_the_root_gather_that_opens_the_forward():
    """One simulated step (about 16 s with the imports, so one test). States: fp32 shards (4 x 1,141,056 / 2 =
    2,282,112 B) and AdamW's two moments (4,564,224 B), plus fused AdamW's step counters (a few bytes). Before
    the first block the step holds them and the root's all-gather: the unsharded bf16 root, 2 x 1,048,640 =
    2,097,280 B, and the bf16 shard it was gathered from (_flat_param.py ``_mp_shard``), 1,048,640 B."""
    from advisor.simulate.fsdp1_step import simulate_fsdp1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = simulate_fsdp1(TINY, world_size=2, strategy="zero3", training=TrainingConfig(seq_len=64, fsdp_version=1),
                              micro_batch_size=1, checkpointing=True)
    assert 0 <= step["states"] - 3 * 2_282_112 < 256
    assert step["moments"]["start_of_forward"] - step["states"] == 2_097_280 + 1_048_640


def test_offload_is_refused():
    from advisor.simulate.fsdp1_step import simulate_fsdp1

    with pytest.raises(ValueError, match="FSDP1 simulates"):
        simulate_fsdp1(TINY, world_size=2, strategy="zero3_offload", training=TrainingConfig(fsdp_version=1),
                       micro_batch_size=1, checkpointing=False)
