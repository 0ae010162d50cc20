"""A traced family on a TP mesh (``advisor.estimate.model_parallel.split_traced``): the profile traced on
the whole model, less what TP takes off a rank. Checked against issue 20's sweep rows, whose simulated peaks
are ``advisor.simulate.mesh_step.simulate_mesh`` (benchmarks/results/sweep.jsonl); the profiles below are
the ones the sweep traced for those rows (``advisor.simulate.profile``, recorded from the plan)."""

from __future__ import annotations

import pytest

from advisor.estimate.activations import ActivationEstimate
from advisor.estimate.model_parallel import estimate_mesh_memory, split_traced
from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.block_profile import BlockProfile
from advisor.model.spec import ModelSpec
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

ZERO3 = STRATEGIES["zero3"].on("torch")


def _line(const: int, per_sample: int, per_layer_sample: int) -> dict:
    return dict(const=const, per_sample=per_sample, per_layer=0, per_layer_sample=per_layer_sample)


def _spec(fields: dict, profile: dict) -> ModelSpec:
    return ModelSpec.model_validate(dict(fields, source="local", count_method="meta_device", traced=[profile]))


# Row 221fc5bac301: Cohere h384, 2 layers, 12 heads / 6 KV, vocabulary 2,432 tied; zero3 tp 2 x dp 4 (8 GPUs),
# micro-batch 1, s 1024, full checkpointing, bf16-mixed, SGD. Simulated peak 43,458,824 bytes.
COHERE = dict(name="sweep/cohere-h384-l2-v2432", architecture="CohereForCausalLM", model_type="cohere",
              total_params=4_473_984, trainable_params=4_473_984, embedding_params=933_888, layer_params=1_769_856,
              head_params=0, other_params=384, tied_embeddings=True, num_layers=2, hidden_size=384,
              num_attention_heads=12, num_kv_heads=6, head_dim=32, intermediate_size=1152, vocab_size=2432,
              max_position_embeddings=8192, block_classes=["CohereDecoderLayer"])
COHERE_PROFILE = dict(
    key=dict(residual_bytes=2, compute_bytes=2, input_casts=False, checkpointing="on", seq_len=1024,
             attention="sdpa", loss="hf", adapters=None),
    saved=_line(2_007_048, 0, 786_432), forward_peak=_line(122_888, 30_437_384, 786_432),
    loss_peak=_line(139_272, 35_393_536, 786_432), block_peak=_line(2_007_048, 22_859_776, 786_432),
    recompute=_line(0, 16_699_392, 0), layer_saved_per_sample=17_485_824)

# Row c5264a595c2d: Granite h256, 4 layers, 4 heads, vocabulary 14,144 untied; zero3 tp 2 x dp_shard 2 x
# 2 replicas, micro-batch 1, s 8192, selective checkpointing, fp16-mixed, Adam. Simulated peak 1,539,128,740.
GRANITE = dict(name="sweep/granite-h256-l4-v14144", architecture="GraniteForCausalLM", model_type="granite",
               total_params=11_045_120, trainable_params=11_045_120, embedding_params=3_620_864,
               layer_params=950_784, head_params=3_620_864, other_params=256, tied_embeddings=False, num_layers=4,
               hidden_size=256, num_attention_heads=4, num_kv_heads=4, head_dim=64, intermediate_size=896,
               vocab_size=14144, max_position_embeddings=8192, block_classes=["GraniteDecoderLayer"])
GRANITE_PROFILE = dict(
    key=dict(residual_bytes=2, compute_bytes=2, input_casts=False, checkpointing="selective", seq_len=8192,
             attention="sdpa", loss="hf", adapters=None),
    saved=_line(2_162_696, 0, 35_782_656), forward_peak=_line(2_031_624, 1_175_683_080, 35_782_656),
    loss_peak=_line(2_162_696, 1_407_221_760, 35_782_656), block_peak=_line(2_162_696, 115_408_896, 35_782_656),
    recompute=_line(0, 75_563_008, 0), layer_saved_per_sample=111_345_664)


@pytest.mark.parametrize("fields, profile, training, mesh, simulated", [
    (COHERE, COHERE_PROFILE, dict(optimizer="sgd", seq_len=1024, activation_checkpointing="on"),
     dict(dp_shard=4, tp=2), 43_458_824),  # the formula shape alone: -5.44%
    (GRANITE, GRANITE_PROFILE, dict(optimizer="adam", precision="fp16-mixed", seq_len=8192,
                                    activation_checkpointing="selective"),
     dict(dp_shard=2, dp_replicate=2, tp=2), 1_539_128_740),  # the formula shape alone: -4.09%
])
def test_traced_family_on_a_tp_mesh_matches_the_simulated_step(fields, profile, training, mesh, simulated):
    spec = _spec(fields, profile)
    mem = estimate_mesh_memory(spec, parse_gpus("8xH100"), TrainingConfig(micro_batch_size=1, **training), ZERO3,
                               ParallelDims(world_size=8, **mesh), micro_batch_size=1, checkpointing=True)
    assert mem.peak_moment == "loss_backward"
    assert abs(mem.peak_allocated - simulated) / simulated < 0.001


def _acts(saved: int, layer: int, block: int) -> ActivationEstimate:
    return ActivationEstimate(saved_bytes=saved, logits_bytes=1_000, loss_transient_bytes=2_000, layer_bytes=layer,
                              backward_temp_bytes=50, returned_logits_bytes=500, block_kept_bytes=block)


def test_split_traced_by_hand():
    """Traced: saved 900 over 2 blocks of 400 each (100 outside), one block's backward 300. The count: 600
    (blocks of 200, 200 outside) and 200 whole, 500 (blocks of 150) and 120 on a rank of tp 2 (TP takes 100 and 80
    off). Full checkpointing (saved block inputs, whole): 900 - 100 = 800. Selective: a block keeps 400 - 200 = 200
    of products beyond the count, of which 60 row-parallel (whole) and 140 column-parallel, split: 70 a block off,
    800 - 2 x 70 = 660 saved, 400 - 50 - 70 = 280 a block. The block moment: 300 - 80 = 220 either way; the loss
    path is not divided (gathered logits)."""
    traced, whole, rank = _acts(900, 300, 400), _acts(600, 200, 200), _acts(500, 120, 150)
    full = split_traced(traced, whole=whole, rank=rank, tp=2)
    assert (full.saved_bytes, full.layer_bytes, full.loss_transient_bytes) == (800, 220, 2_000)
    selective = split_traced(traced, whole=whole, rank=rank, tp=2, num_layers=2, row_parallel_kept=60)
    assert (selective.saved_bytes, selective.block_kept_bytes, selective.layer_bytes) == (660, 280, 220)
