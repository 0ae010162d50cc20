"""A traced family whose MLP is not gated, on a TP mesh (``advisor.estimate.model_parallel``,
``profiles/tensor_parallel.json`` mlp_wide_saved): TP takes off a rank its share of the tensors of the MLP's
inner width that a block saves, two for StarCoder2 (c_fc's output, saved by the tanh GELU; the GELU's output,
saved by c_proj), where the decoder count's gated MLP lists four. Checked against the seed-7 sweep row
db26a8a93372 (``advisor.simulate.mesh_step.simulate_mesh``, torch 2.13); the profile is the one the sweep
traced for it (``advisor.simulate.profile``, recorded from the plan). CPU only, no network."""

from __future__ import annotations

from advisor.estimate.model_parallel import estimate_mesh_memory
from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig


def _line(const: int, per_sample: int, per_layer_sample: int) -> dict:
    return dict(const=const, per_sample=per_sample, per_layer=0, per_layer_sample=per_layer_sample)


# StarCoder2 h384, MLP 1536, 6 heads, 3 layers, vocabulary 32,000 tied; zero3 tp 2 x dp_shard 2 x 2 replicas
# (8 GPUs), micro-batch 1, s 8192, no checkpointing, bf16-mixed, transformers' loss, Adam.
STARCODER2 = dict(name="sweep/starcoder2-h384-l3-v32000", architecture="Starcoder2ForCausalLM",
                  model_type="starcoder2", total_params=17_612_160, trainable_params=17_612_160,
                  embedding_params=12_288_000, layer_params=1_774_464, head_params=0, other_params=768,
                  tied_embeddings=True, num_layers=3, hidden_size=384, num_attention_heads=6, num_kv_heads=6,
                  head_dim=64, intermediate_size=1536, vocab_size=32000, max_position_embeddings=8192,
                  block_classes=["Starcoder2DecoderLayer"])
PROFILE = dict(
    key=dict(residual_bytes=2, compute_bytes=2, input_casts=False, checkpointing="off", seq_len=8192,
             attention="sdpa", loss="hf", adapters=None),
    saved=_line(26_673_160, 0, 100_925_440), forward_peak=_line(1_966_088, 2_634_252_296, 100_925_440),
    loss_peak=_line(2_097_160, 3_158_343_680, 100_925_440), block_peak=_line(26_673_160, 31_457_280, 100_925_440),
    recompute=_line(0, 0, 0), layer_saved_per_sample=103_022_592)
SIMULATED = 3_465_819_860  # peak of the simulated mesh step
BEFORE = 3_390_241_032  # four wide tensors taken off: -2.18%


def _estimate():
    spec = ModelSpec.model_validate(dict(STARCODER2, source="local", count_method="meta_device", traced=[PROFILE]))
    training = TrainingConfig(micro_batch_size=1, optimizer="adam", precision="bf16-mixed", seq_len=8192,
                              activation_checkpointing="off", loss="hf")
    return estimate_mesh_memory(spec, parse_gpus("8xH100"), training, STRATEGIES["zero3"].on("torch"),
                                ParallelDims(world_size=8, dp_shard=2, dp_replicate=2, tp=2), micro_batch_size=1,
                                checkpointing=False)


def test_tp_takes_off_two_wide_tensors_a_block_by_hand():
    """At the loss every block's saved tensors are held. TP 2 leaves a rank half of each wide tensor: taking off
    two of them, not four, keeps 3 blocks x 8,192 tokens x 2 tensors x 1,536 x 2 bytes / 2 = 75,497,472
    bytes more on the rank."""
    mem = _estimate()
    assert mem.peak_moment == "loss_backward"
    assert mem.peak_allocated - BEFORE == 75_497_472


def test_matches_the_simulated_mesh_step():
    mem = _estimate()
    assert abs(mem.peak_allocated - SIMULATED) <= 0.0001 * SIMULATED, mem.peak_allocated
