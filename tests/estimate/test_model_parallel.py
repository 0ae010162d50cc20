"""Memory on a device mesh: per-GPU figures worked by hand for a tiny Llama, invariants for any mesh."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.estimate.memory import estimate_memory
from advisor.estimate.model_parallel import (estimate_mesh_memory, mesh_activations, ring_buffer_bytes,
                                             tp_rank_spec)
from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.architectures import count_from_config
from advisor.model.sources import resolve_model
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

# hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128, vocabulary 256, untied.
# One block: q 64*64 + k 64*32 + v 64*32 + o 64*64 + MLP 3*64*128 + two norms 2*64 = 36,992.
# Embedding 256*64 = 16,384, head 16,384, final norm 64: 2*36,992 + 32,768 + 64 = 106,816.
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            tie_word_embeddings=False)
ZERO3 = STRATEGIES["zero3"].on("torch")


@pytest.fixture(scope="module")
def tiny():
    spec = count_from_config(dict(TINY), name="tiny-llama", source="local")
    assert spec.total_params == 106_816
    return spec


def _mesh(world, **degrees):
    dp_shard = world // (degrees.get("tp", 1) * degrees.get("cp", 1) * degrees.get("dp_replicate", 1))
    return ParallelDims(dp_shard=dp_shard, world_size=world, **degrees)


def test_tp_rank_owns_half_the_matrices_and_vocabulary_and_whole_norms(tiny):
    # TP 2: a block (36,992 - 128 norm weights) / 2 + 128 = 18,560; embedding and head 8,192 each; final norm 64.
    local = tp_rank_spec(tiny, 2)
    assert (local.layer_params, local.embedding_params, local.head_params) == (18_560, 8_192, 8_192)
    assert local.total_params == 2 * 18_560 + 2 * 8_192 + 64 == 53_568


def test_fsdp_on_a_tp_mesh_shards_the_tp_share_over_dp_shard(tiny):
    # tp 2 x dp_shard 2 on 4 GPUs: fp32 parameters 4 * 53,568 / 2 = 107,136 bytes a rank; AdamW twice that.
    mem = estimate_mesh_memory(tiny, parse_gpus("4xH100"), TrainingConfig(seq_len=16), ZERO3, _mesh(4, tp=2),
                               micro_batch_size=1, checkpointing=False)
    assert (mem.states_params, mem.states_grads, mem.states_optimizer) == (107_136, 107_136, 214_272)


def test_tp_and_cp_block_activations_by_hand(tiny):
    """bf16 FSDP2 recipe (residual and compute 2 bytes), SDPA, per token and block:
    tp 1: norms 2 x (fp32 input 4h + normalised 2h + the linear's input 2h) = 1,024; attention q 2*64 +
    k,v 2*2*32 + output 2*64 + fp32 lse 4*4 = 400; MLP 4 * 2 * 128 = 1,024: 2,448.
    tp 2 with sequence parallelism: each norm keeps half of its 6h and the gathered 2h input whole,
    2 x (3h + 2h) = 640; attention over 2 heads and 1 KV head 2*32 + 2*2*16 + 2*32 + 4*2 = 200;
    MLP 4 * 2 * 64 = 512: 1,352. cp 2 halves the tokens (16 -> 8)."""
    training = TrainingConfig(seq_len=16)

    def layer(world, **degrees):
        return mesh_activations(tiny, training, ZERO3, _mesh(world, **degrees), micro_batch_size=1,
                                checkpointing=False, sequence_parallel=True).layer_bytes

    assert layer(1) == 16 * 2_448
    assert layer(2, tp=2) == 16 * 1_352
    assert layer(2, cp=2) == 8 * 2_448
    assert layer(4, tp=2, cp=2) == 8 * 1_352


def test_without_sequence_parallelism_the_norms_stay_whole(tiny):
    """What wrap() runs (transformers' plan, no SP): each norm keeps its whole 6h plus the linear's 2h
    input, 2 x 8h = 1,024 per token as at tp 1; attention 200 and MLP 512 as above: 1,736."""
    layer = mesh_activations(tiny, TrainingConfig(seq_len=16), ZERO3, _mesh(2, tp=2), micro_batch_size=1,
                             checkpointing=False).layer_bytes
    assert layer == 16 * 1_736


def test_eager_attention_keeps_its_scores_on_a_tp_mesh(tiny):
    """--attention eager under tp 2 (no SP): the rank's 2 heads (q width 32) save q and repeated k, v
    (3 x 2 x 32 = 192), the fp32 softmax output and its bf16 copy over 16 keys a head (2 x 16 x (4 + 2)
    = 192) and the AV output (2 x 32 = 64): 448 a token, where SDPA saves 200. Norms 1,024 and MLP 512
    as above: 1,984. The scores are the rank's heads only: at tp 1 they are 4 x 16 x 6 = 384."""
    eager = TrainingConfig(seq_len=16, attention="eager")
    layer = {tp: mesh_activations(tiny, eager, ZERO3, _mesh(tp, tp=tp), micro_batch_size=1,
                                  checkpointing=False).layer_bytes for tp in (1, 2)}
    assert layer[2] == 16 * 1_984
    assert layer[1] == 16 * (2_448 - 400 + 3 * 2 * 64 + 384 + 2 * 64)


def test_a_tied_embedding_is_replicated_over_tp():
    # wrappers.tensor_parallel leaves a tied embedding/head out of the plan: 16,384 whole on each TP rank.
    spec = count_from_config(dict(TINY, tie_word_embeddings=True), name="tiny-tied", source="local")
    local = tp_rank_spec(spec, 2)
    assert (local.layer_params, local.embedding_params) == (18_560, 16_384)
    assert local.total_params == 2 * 18_560 + 16_384 + 64


def test_checkpointed_block_inputs_are_sequence_shards_under_sequence_parallelism(tiny):
    # Under checkpointing each block keeps its input: 16 tokens x 2 blocks x 2h bytes = 4,096, halved by tp 2.
    training = TrainingConfig(seq_len=16, activation_checkpointing="on")
    saved = {tp: mesh_activations(tiny, training, ZERO3, _mesh(tp, tp=tp), micro_batch_size=1, checkpointing=True,
                                  sequence_parallel=True).saved_bytes for tp in (1, 2)}
    assert saved[1] - saved[2] == 2_048


def test_ring_buffers_by_hand(tiny):
    # cp 2, seq 16: a chunk is 8 tokens x (K and V) x 2 KV heads x 16 x 2 bytes = 1,024; two chunks and two
    # of their gradients in flight: 4,096.
    assert ring_buffer_bytes(tiny, TrainingConfig(seq_len=16), _mesh(2, cp=2), micro_batch_size=1) == 4_096


def test_data_parallel_mesh_equals_the_data_parallel_estimate():
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    hw, training = parse_gpus("8xH100"), TrainingConfig(seq_len=4096)
    dp = estimate_memory(spec, hw, training, ZERO3, micro_batch_size=2, checkpointing=True)
    mesh = estimate_mesh_memory(spec, hw, training, ZERO3, ParallelDims.data_parallel(8), micro_batch_size=2,
                                checkpointing=True)
    assert mesh == dp


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4]), which=st.sampled_from(["tp", "cp"]),
       ckpt=st.booleans(), micro=st.integers(1, 4), seq_exp=st.integers(10, 15))
def test_memory_never_rises_when_tp_or_cp_doubles(tp, cp, which, ckpt, micro, seq_exp):
    """On 8 GPUs with every other degree folded into dp_shard: doubling tp or cp never adds memory,
    except that the norm weights TP replicates are then sharded over fewer ranks: at most their
    fp32 weights, gradients, AdamW states and step temporary (20 bytes each) plus fragmentation."""
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    hw = parse_gpus("8xH100")
    training = TrainingConfig(seq_len=2 ** seq_exp)
    doubled = dict(tp=tp, cp=cp)
    doubled[which] *= 2
    if doubled["tp"] * doubled["cp"] > 8:
        return
    before = estimate_mesh_memory(spec, hw, training, ZERO3, _mesh(8, tp=tp, cp=cp), micro_batch_size=micro,
                                  checkpointing=ckpt)
    after = estimate_mesh_memory(spec, hw, training, ZERO3, _mesh(8, **doubled), micro_batch_size=micro,
                                 checkpointing=ckpt)
    norms = spec.hidden_size * (2 * spec.num_layers + 1)
    assert after.total <= before.total + 21 * norms


@pytest.mark.parametrize("model", ["deepseek-ai/DeepSeek-V3", "ai21labs/Jamba-v0.1", "meta-llama/Llama-3.1-8B"])
def test_a_tp_rank_holds_its_share_of_every_block_dense_ones_included(model):
    """tp ranks together hold the model once, plus the norms every rank keeps whole (two per block and the final
    one, ``other``): tp x rank = total + (tp - 1) x norms, up to the ceilings. DeepSeek-V3's 3 dense layers were
    counted as MoE layers (15.5B parameters too many on each of 2 ranks); the rank's spec now passes its own
    validator (its components sum to its total)."""
    from advisor.model.sources import resolve_model

    spec = resolve_model(model)
    tp = 2
    rank = tp_rank_spec(spec, tp)
    norms = 2 * spec.hidden_size * spec.num_layers + (spec.other_params or 0)
    ceilings = 3 * spec.num_layers + 2  # at most one element of rounding per split tensor group
    assert abs(tp * rank.total_params - (spec.total_params + (tp - 1) * norms)) <= tp * ceilings
