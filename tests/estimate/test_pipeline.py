"""Per-stage memory and step time under pipeline parallelism, worked by hand on a tiny Llama."""

from __future__ import annotations

from fractions import Fraction

import pytest

from advisor.estimate.pipeline import estimate_pipeline_memory, split_layers
from advisor.estimate.pipeline_schedules import in_flight
from advisor.estimate.pipeline_time import estimate_pipeline_step_time
from advisor.hardware.cluster import parse_gpus
from advisor.mesh import ParallelDims
from advisor.model.architectures import count_from_config
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

# hidden 64, 4 layers, 4 heads of 16, 2 KV heads, MLP 128, vocabulary 256, untied.
# One block: q 64*64 + k 64*32 + v 64*32 + o 64*64 + MLP 3*64*128 + two norms 2*64 = 36,992.
# Embedding 256*64 = 16,384, head 16,384, final norm 64: 4*36,992 + 32,768 + 64 = 180,800.
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            tie_word_embeddings=False)
ZERO3 = STRATEGIES["zero3"].on("torch")
TRAINING = TrainingConfig(seq_len=16, activation_checkpointing="on")


@pytest.fixture(scope="module")
def tiny():
    spec = count_from_config(dict(TINY), name="tiny-llama-4", source="local")
    assert spec.total_params == 180_800
    return spec


def _stages(spec, pp, schedule="1f1b", m=8, v=1, tied=False):
    mesh = ParallelDims(pp=pp, pp_schedule=schedule, virtual_stages=v, dp_shard=1, world_size=pp)
    return estimate_pipeline_memory(spec, parse_gpus(f"{pp}xH100"), TRAINING, ZERO3, mesh, micro_batch_size=1,
                                    checkpointing=True, num_micro_batches=m).stages


def test_states_per_stage_by_hand(tiny):
    """pp 2 on 2 GPUs (dp_shard 1: FSDP2 holds whole fp32 states). Rank 0: 2 blocks + embedding =
    2*36,992 + 16,384 = 90,368 parameters, 4 bytes each 361,472, AdamW's two moments 722,944. Rank 1:
    2 blocks + head + final norm = 73,984 + 16,384 + 64 = 90,432: 361,728 and 723,456."""
    first, last = (s.memory for s in _stages(tiny, 2))
    assert (first.states_params, first.states_grads, first.states_optimizer) == (361_472, 361_472, 722_944)
    assert (last.states_params, last.states_grads, last.states_optimizer) == (361_728, 361_728, 723_456)


def test_tied_embeddings_are_held_on_both_ends(tiny):
    """Tied: the config counts the matrix once (180,800 - 16,384 = 164,416), but pipeline rank 0 holds
    the embedding and rank 1 the head, a copy each: 90,368 and 90,432 parameters as untied."""
    tied = count_from_config(dict(TINY, tie_word_embeddings=True), name="tiny-tied", source="local")
    assert tied.total_params == 164_416
    first, last = (s.memory for s in _stages(tied, 2))
    assert (first.states_params, last.states_params) == (4 * 90_368, 4 * 90_432)


# Saved activations of ONE micro-batch through one rank, full checkpointing, bf16 FSDP2 recipe (2-byte
# residual), 16 tokens, h 64, head_dim 16 (tests/estimate/test_model_parallel.py has the per-block count):
# each block keeps its input, 2*64 = 128 bytes a token; every rank its RoPE cos/sin, 2*2*16 = 64;
# rank 0 the token ids (int64, 8); the last rank the labels (8) and the final norm (fp32 input 4h +
# normalised 2h + the head's input 2h = 512).
ONE_LAYER = {"first": 16 * (128 + 64 + 8), "middle": 16 * (128 + 64), "last": 16 * (128 + 64 + 8 + 512)}


@pytest.mark.parametrize("schedule, v, counts", [
    ("gpipe", 1, [8, 8, 8, 8]),                     # all m micro-batches (GPipe)
    ("1f1b", 1, [4, 3, 2, 1]),                      # p - i
    # Megatron's warm-up 2 (p - i - 1) + (v - 1) p chunks + 1, each 1/v of the rank: rank 0 (6 + 4 + 1)/2
    # = 5.5 = p (1 + (p - 1)/(p v)) = 4 x 11/8, the interleaving penalty.
    ("interleaved_1f1b", 2, [Fraction(11, 2), Fraction(9, 2), Fraction(7, 2), Fraction(5, 2)]),
    ("zb_h2", 1, [7, 5, 3, 1]),                     # 2 (p - i) - 1
])
def test_in_flight_per_schedule(schedule, v, counts):
    assert [in_flight(schedule, rank=i, pp=4, micro_batches=8, chunks=v) for i in range(4)] == counts


def test_v_schedules_are_balanced_and_capped_by_m():
    assert [in_flight("zbv", rank=i, pp=4, micro_batches=8, chunks=2) for i in range(4)] == [4] * 4
    # m 4 < 2p - 1: torch's ZB-V runs m + i + 1 chunk forwards before rank i's first backward (its warm-up
    # 2(p - i) - 1 + i + (p - i) forwards, less those of micro-batches 4 to 6 that do not exist): 5/2 to 8/2.
    assert [in_flight("zbv", rank=i, pp=4, micro_batches=4, chunks=2) for i in range(4)] == [
        Fraction(5, 2), 3, Fraction(7, 2), 4]
    assert in_flight("dualpipev", rank=0, pp=4, micro_batches=8, chunks=2) == Fraction(9, 2)  # p + 1/2
    assert in_flight("1f1b", rank=0, pp=4, micro_batches=2) == 2  # fewer micro-batches than stages


@pytest.mark.parametrize("schedule, expected", [
    # pp 4 (one block a rank), m 8: in flight x one micro-batch (ONE_LAYER above). GPipe holds all 8 at
    # its first backward, 7 at its second, by then with the rank's fp32 gradients (rank 0: 4 x 53,376 =
    # 213,504 bytes, far more than one micro-batch's 3,200), so its peak is the second: 7 each. The last rank
    # computes each micro-batch's loss in its forward: the 6 whose backward has not begun each keep the fp32
    # log-softmax output, 16 tokens x 256 x 4 = 16,384 (the running one's is the moments' loss term).
    ("gpipe", [7 * 3_200, 7 * 3_072, 7 * 3_072, 7 * 11_392 + 6 * 16_384]),
    ("1f1b", [4 * 3_200, 3 * 3_072, 2 * 3_072, 1 * 11_392]),
    # ZB-H2 runs each W right after its B: when a B starts no W is pending, and the running B's W inputs are
    # its own saved activations (its output gradients replace what it frees), so nothing beyond 2 (p - i) - 1.
    ("zb_h2", [7 * 3_200, 5 * 3_072, 3 * 3_072, 1 * 11_392]),
    # ZB-2p (the paper's automatic schedule): ZB-H2's forwards, and deferred W passes (26,624 bytes each,
    # W_STASH below) wherever its limit of 2p = 8 micro-batches of the blocks' activations (3,072 a layer, the
    # scheduler's f_mem: no token ids, no head) leaves room: (8 - 7) x 3,072, 3 x, 5 x and, on the last rank,
    # 7 x 3,072 = 21,504 (not 7 x 11,392 with its head's tensors) are all under 26,624: no W fits.
    ("zb_2p", [7 * 3_200, 5 * 3_072, 3 * 3_072, 1 * 11_392]),
])
def test_saved_activations_per_stage_by_hand(tiny, schedule, expected):
    assert ONE_LAYER == {"first": 3_200, "middle": 3_072, "last": 11_392}
    assert [s.activation_bytes for s in _stages(tiny, 4, schedule)] == expected


# What a deferred W pass holds of one block, per token: the linears' inputs (q/k/v's and gate/up's normalised
# input 64, o_proj's 64, down_proj's 128) and their output gradients (q 64 + k 32 + v 32, o 64, gate 128 +
# up 128, down 64), 2 bytes each: 2 x (64+64+64+128 + 64+64+64+256) = 1,664 bytes, x 16 tokens = 26,624.
W_STASH = 26_624


def test_zb_h1_holds_the_w_passes_it_defers(tiny):
    """ZB-H1 delays stage i's W by i passes (Qi et al. 2024, Figure 3): when a B starts rank i holds p - i
    micro-batches in flight and the W inputs of the i whose W it deferred."""
    assert [s.activation_bytes for s in _stages(tiny, 4, "zb_h1")] == [
        4 * 3_200, 3 * 3_072 + 1 * W_STASH, 2 * 3_072 + 2 * W_STASH, 1 * 11_392 + 3 * W_STASH]


@pytest.mark.parametrize("schedule", ["zb_h1", "zb_h2"])
@pytest.mark.parametrize("pp, m", [(2, 1), (2, 8), (4, 3), (4, 8), (6, 12)])
def test_w_held_is_what_the_simulated_order_holds(schedule, pp, m):
    """The W stashes when a B starts, counted on the order the stage simulator replays
    (advisor.simulate.pipeline_order): the micro-batches whose B has run and whose W has not."""
    from advisor.estimate.pipeline_schedules import w_held
    from advisor.simulate.pipeline_order import stage_order

    for rank in range(pp):
        order = stage_order(schedule.replace("_", "-"), stage=rank, num_stages=pp, num_microbatches=m)
        done_b = done_w = most = 0
        for step in order:
            if step.kind == "B":
                most = max(most, done_b - done_w)
                done_b += 1
            done_w += step.kind == "W"
        assert w_held(schedule, rank=rank, pp=pp, micro_batches=m) == most


def test_gradients_are_held_after_the_first_backward(tiny):
    """dp_shard 1 (whole fp32 states): 1F1B's ranks peak at a backward after their first, every gradient
    allocated: rank 0 4 x (36,992 + 16,384) = 213,504 bytes, rank 1 4 x 36,992 = 147,968, the last rank
    4 x (36,992 + 16,384 + 64) = 213,760. With m = 4 rank 0's warm-up holds every micro-batch and no forward
    follows its first backward: its second (3 in flight, gradients allocated) is still the larger here."""
    assert [s.memory.grads for s in _stages(tiny, 4, "1f1b")] == [213_504, 147_968, 147_968, 213_760]
    first = _stages(tiny, 4, "1f1b", m=4)[0]
    assert (first.in_flight, first.memory.grads, first.activation_bytes) == (3, 213_504, 3 * 3_200)


def test_v_shape_puts_embedding_and_head_on_rank_zero(tiny):
    """ZB-V on pp 2 (two chunks a rank, one block each): rank 0 holds chunks 0 and 3, so the
    embedding, the head and the final norm: 2 blocks + 16,384 + 16,384 + 64 = 106,816 parameters;
    rank 1 two blocks alone, 73,984. In flight: p = 2 micro-batches on both, rank 0's one through its
    two blocks = 16 x (2 x 128 + 64 + 8 + 8 + 512) = 16 x 848 = 13,568, and no deferred W pass (torch's
    ZB-V runs each W before the next backward until its cool-down; tests/estimate/test_pipeline_torch_orders.py)."""
    first, second = _stages(tiny, 2, "zbv")
    assert (first.embedding, first.head, second.embedding, second.head) == (True, True, False, False)
    assert (first.memory.states_params, second.memory.states_params) == (4 * 106_816, 4 * 73_984)
    assert first.activation_bytes == 2 * 13_568


def test_worst_stage_is_the_reported_peak(tiny):
    stages = _stages(tiny, 4, "gpipe")
    mesh = ParallelDims(pp=4, pp_schedule="gpipe", dp_shard=1, world_size=4)
    result = estimate_pipeline_memory(tiny, parse_gpus("4xH100"), TRAINING, ZERO3, mesh, micro_batch_size=1,
                                      checkpointing=True, num_micro_batches=8)
    assert result.worst.memory.total == max(s.memory.total for s in stages)


@pytest.mark.parametrize("pp, schedule, v", [(2, "1f1b", 1), (4, "gpipe", 1), (4, "zb_h1", 1), (4, "zb_2p", 1),
                                             (2, "zbv", 1),
                                             (2, "interleaved_1f1b", 2), (2, "dualpipev", 1)])
def test_the_search_estimates_the_worst_rank(tiny, pp, schedule, v):
    """The search estimates only the ranks that can be worst; the worst must be the same as over all."""
    mesh = ParallelDims(pp=pp, pp_schedule=schedule, virtual_stages=v, dp_shard=2, world_size=2 * pp)
    kwargs = dict(micro_batch_size=2, checkpointing=False, num_micro_batches=8)
    hw = parse_gpus(f"{2 * pp}xH100")
    every = estimate_pipeline_memory(tiny, hw, TRAINING, ZERO3, mesh, **kwargs)
    some = estimate_pipeline_memory(tiny, hw, TRAINING, ZERO3, mesh, every_rank=False, **kwargs)
    assert some.worst.memory == every.worst.memory and len(some.stages) <= len(every.stages)


def test_uneven_split_puts_extra_layers_in_the_middle():
    assert split_layers(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert split_layers(61, 4) == (15, 15, 16, 15)
    assert split_layers(32, 4) is None  # even
    assert split_layers(30, 4, 2) == (6, 8, 8, 8)


@pytest.mark.parametrize("schedule, v, bubble_per_micro", [
    ("1f1b", 1, 3),                     # (p - 1) micro-batch times (Narayanan et al. 2021)
    ("gpipe", 1, 3),
    ("interleaved_1f1b", 2, 1.5),       # (p - 1)/v
    ("zb_h1", 1, 1),                    # (p - 1)(F + B - 2W) at F = B = W: a third of 1F1B's
    ("zbv", 1, 0),
])
def test_bubble_per_schedule(tiny, schedule, v, bubble_per_micro):
    """pp 4 on one node, m 8: the step is compute + bubble + exposed communication + optimizer, and the
    bubble is the schedule's (p - 1)-term in micro-batch times, compute / m each."""
    mesh = ParallelDims(pp=4, pp_schedule=schedule, virtual_stages=v, dp_shard=1, world_size=4)
    t = estimate_pipeline_step_time(tiny, parse_gpus("4xH100"), TRAINING, ZERO3, mesh, micro_batch_size=1,
                                    checkpointing=True, num_micro_batches=8)
    bubble = t.step_s - t.compute_s - t.exposed_communication_s - t.optimizer_s
    assert bubble == pytest.approx(bubble_per_micro * t.compute_s / 8, rel=1e-9, abs=1e-15)
    assert t.gradient_accumulation_steps == 8


# Tiny Mixtral: the tiny Llama's attention (12,288) + router 64*4 = 256 + 4 experts of 3*64*128 = 24,576
# + two norms 128 = 110,976 a block.
TINY_MOE = dict(TINY, model_type="mixtral", architectures=["MixtralForCausalLM"], num_hidden_layers=2,
                num_local_experts=4, num_experts_per_tok=2)


def test_expert_parallelism_by_hand():
    """ep 2 on dp_shard 2 (2 GPUs, no pp), micro-batch 1 of 16 tokens, checkpointing, bf16 FSDP2.
    States: the same 1/2 of every parameter with or without ep. A block's backward: FSDP2's two
    unsharded blocks (bf16), the block's bf16 gradients and fp32 reduce-scatter input, 2 + 2 + 2 + 4 = 10
    bytes per block parameter, now over 2 of the 4 experts: 10 x 2 x 24,576 = 491,520 bytes fewer; the
    all-to-all holds the send and receive buffers of k x tokens rows of h: 2 x 2 x 16 x 64 x 2 = 8,192
    bytes more. Routing imbalance (1.25, profiles/expert_parallel.json): 0.25 x 2 x 16 = 8 more rows on
    the busiest rank, each the routed expert's saved bytes 2 x (2 x 64 + 4 x 128) = 1,280: 10,240."""
    spec = count_from_config(dict(TINY_MOE), name="tiny-mixtral", source="local")
    assert (spec.layer_params, spec.expert_params) == (110_976, 24_576)

    def stage(ep):
        mesh = ParallelDims(dp_shard=2, ep=ep, world_size=2)
        return estimate_pipeline_memory(spec, parse_gpus("2xH100"), TRAINING, ZERO3, mesh, micro_batch_size=1,
                                        checkpointing=True, num_micro_batches=1).stages[0]

    one, two = stage(1), stage(2)
    assert one.memory.states_total == two.memory.states_total
    assert one.memory.at_block_backward - two.memory.at_block_backward == 491_520 - 8_192
    assert (one.imbalance_bytes, two.imbalance_bytes) == (0, 10_240)


def test_all_to_all_and_p2p_on_the_links_they_cross():
    """H100 nodes: NVLink 4 at 450 GB/s a direction, InfiniBand NDR 50 GB/s a port, one port a GPU
    (profiles/interconnects.json), 0.8 of each reached (profiles/efficiency.json); latencies 2 and 5 us.
    An all-to-all of 64 MiB on 8 ranks of one node sends 7/8 of it over NVLink:
    7/8 x 67,108,864 / (450e9 x 0.8) + 2e-6 = 165.12 us. On 16 ranks over two nodes (stride 1) 7/16 over
    NVLink and 8/16 over the GPU's NIC: 7/16 x 67,108,864 / 360e9 + 2e-6 + 8/16 x 67,108,864 / 40e9 + 5e-6.
    A point-to-point send of 64 MiB between pipeline ranks 8 apart crosses the NIC: 67,108,864 / 40e9 + 5e-6."""
    from advisor.estimate.pipeline_time import all_to_all_s, p2p_hop_s
    from advisor.hardware.efficiency import load_efficiency

    eff, hw, mib64 = load_efficiency(), parse_gpus("2x8xH100"), 64 * 2**20
    assert all_to_all_s(mib64, hw, eff, size=8, stride=1) == pytest.approx(7 / 8 * mib64 / 360e9 + 2e-6)
    assert all_to_all_s(mib64, hw, eff, size=16, stride=1) == pytest.approx(
        7 / 16 * mib64 / 360e9 + 2e-6 + 8 / 16 * mib64 / 40e9 + 5e-6)
    assert p2p_hop_s(mib64, hw, eff, stride=8) == pytest.approx(mib64 / 40e9 + 5e-6)
    assert p2p_hop_s(mib64, hw, eff, stride=4) == pytest.approx(mib64 / 360e9 + 2e-6)


# GPT-3-like (GPT-2 with F.gelu, Megatron's GeLU): h 64, 4 heads, 16 tokens, eager attention, no checkpointing,
# fp16 under FSDP2's policy (16-bit residual). One block a rank keeps Korthikanti et al.'s 34h + 5as a token:
# 34 x 64 + 5 x 4 x 16 = 2,496, x 16 tokens = 39,936 a micro-batch.
TINY_GPT3 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=4, n_head=4, vocab_size=256,
                 n_positions=64, activation_function="gelu", tie_word_embeddings=True)


def test_gpt3_like_middle_stages_hold_korthikantis_count():
    """A middle rank holds in-flight x 39,936 and nothing outside its block: no token ids, no embedding
    dropout mask, no final LayerNorm or head input. Before the fix a non-head rank was also relieved of
    RMSNorm's 8h a token where GPT-2's final LayerNorm and head input are 4h: 3h x 16 = 3,072 short."""
    spec = count_from_config(dict(TINY_GPT3), name="tiny-gpt3", source="local")
    training = TrainingConfig(seq_len=16, activation_checkpointing="off", attention="eager", precision="fp16-mixed")
    mesh = ParallelDims(pp=4, pp_schedule="1f1b", dp_shard=1, world_size=4)
    stages = estimate_pipeline_memory(spec, parse_gpus("4xH100"), training, ZERO3, mesh, micro_batch_size=1,
                                      checkpointing=False, num_micro_batches=8).stages
    assert [s.activation_bytes for s in stages[1:3]] == [3 * 39_936, 2 * 39_936]


def test_the_planner_still_refuses_gpt2_meshes():
    """The estimate counts a GPT-2 stage; the planner's check (wrap() splits Llama-shaped models) refuses it."""
    from advisor.estimate.model_parallel import check_mesh_support

    spec = count_from_config(dict(TINY_GPT3), name="tiny-gpt3", source="local")
    with pytest.raises(ValueError, match="needs a Llama-like attention decoder"):
        check_mesh_support(spec, TRAINING, ZERO3, ParallelDims(pp=4, dp_shard=1, world_size=4))
