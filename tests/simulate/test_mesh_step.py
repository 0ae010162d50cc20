"""The simulator on a TP 2 x FSDP 2 mesh under a fake process group of 4 ranks.

Checked against a hand count of the tiny Llama ``llama_gqa_untied`` (tests/conftest.py: hidden 64,
3 layers, 8 heads of 8, 2 KV heads, MLP 160, vocabulary 1000, untied): a layer is q, o 2 x 64^2 +
k, v 2 x 64 x 16 + MLP 3 x 64 x 160 + two norms 128 = 41,088; with the embedding and head
2 x 64,000 and the final norm 64, 251,328 parameters. TP 2 splits every matrix (transformers'
plan splits the embedding and head by vocabulary too) and FSDP 2 splits it again: 250,880 / 4; the
448 norm weights are split by FSDP alone: / 2. So rank 0 holds 62,720 + 224 = 62,944 fp32 values.
"""

from __future__ import annotations

import pytest
from tests.conftest import TINY_CONFIGS

from advisor.mesh import ParallelDims
from advisor.simulate.mesh_step import simulate_mesh
from advisor.training import TrainingConfig

LOCAL_PARAMS = 62_944
ROPE_BUFFER_BYTES = 2 * 4 * 4  # inv_freq and original_inv_freq: head_dim / 2 fp32 values each
NUM_TENSORS = 3 * 9 + 3  # AdamW keeps one fp32 "step" scalar per parameter tensor


def test_tp_by_fsdp_mesh_step_holds_a_quarter_of_the_weights():
    step = simulate_mesh(dict(TINY_CONFIGS["llama_gqa_untied"]), dims=ParallelDims(dp_shard=2, tp=2, world_size=4),
                         training=TrainingConfig(seq_len=32, precision="fp32"), micro_batch_size=1)
    assert step.params == 4 * LOCAL_PARAMS + ROPE_BUFFER_BYTES
    assert step.optimizer == 2 * 4 * LOCAL_PARAMS + 4 * NUM_TENSORS  # exp_avg and exp_avg_sq of the shards
    assert step.activations > 0 and step.temporary > 0 and step.peak_bytes > step.params + step.optimizer


def test_context_parallelism_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="needs CUDA"):
        simulate_mesh(dict(TINY_CONFIGS["llama_gqa_untied"]), dims=ParallelDims(dp_shard=2, cp=2, world_size=4),
                      training=TrainingConfig(seq_len=32), micro_batch_size=1)


# The mesh estimate against the simulated step, for the recipe wrap() runs (transformers' TP plan: no
# sequence parallelism, logits gathered, a tied embedding replicated over tp), within 1%. A Llama-3-like shape
# scaled down to run in seconds (GQA with 4 KV heads, SwiGLU); benchmarks/accuracy_mesh.py has larger ones.
SMALL = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=896,
             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, vocab_size=4000,
             tie_word_embeddings=False)


@pytest.mark.parametrize("config, degrees, checkpointing", [
    (SMALL, dict(dp_shard=2, tp=2), False),
    (SMALL, dict(dp_replicate=2, dp_shard=2, tp=2), True),
    (dict(SMALL, tie_word_embeddings=True), dict(dp_shard=2, tp=2), False),
], ids=["tp2-untied", "hsdp-tp2-ckpt", "tp2-tied"])
def test_mesh_estimate_matches_the_simulated_peak(config, degrees, checkpointing):
    from advisor.estimate.model_parallel import estimate_mesh_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.sources import spec_from_config
    from advisor.strategies import get_strategy

    dims = ParallelDims(world_size=degrees.get("dp_replicate", 1) * degrees["dp_shard"] * degrees["tp"], **degrees)
    training = TrainingConfig(seq_len=256, precision="bf16-mixed")
    step = simulate_mesh(dict(config), dims=dims, training=training, micro_batch_size=2, checkpointing=checkpointing)
    est = estimate_mesh_memory(spec_from_config(dict(config), name="small", source="local"), parse_gpus(f"{dims.world_size}xH100"),
                               training, get_strategy("zero3").on("torch"), dims, micro_batch_size=2,
                               checkpointing=checkpointing)
    assert est.peak_allocated == pytest.approx(step.peak_bytes, rel=0.01)
