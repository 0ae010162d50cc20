"""torchao float8 training in the step time (advisor.estimate.float8_time), worked by hand."""

from __future__ import annotations

import pytest

from advisor.estimate.float8_time import float8_gather_saving_bytes, float8_linears, float8_work
from advisor.estimate.step_time import estimate_step_time
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import resolve_model
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
            num_hidden_layers=1, vocab_size=256, tie_word_embeddings=False)


def _tiny(**change):
    return resolve_model({**TINY, **change})


def test_flops_split_and_cast_bytes_by_hand():
    """The module docstring's example: q, k, v, o 64 -> 64, gate, up 64 -> 128, down 128 -> 64 (40,960
    weights), 32 tokens, weights whole. FLOPs 2 x 40,960 x 32 = 2,621,440 forward, twice that backward.
    Casts: forward 6 B x 32 tokens x 512 input features + 5 B x 40,960 weights = 303,104; backward
    6 x 32 x 576 output features + 3 x 40,960 = 233,472."""
    spec = _tiny()
    assert sorted(float8_linears(spec)) == sorted([(64, 64)] * 4 + [(64, 128)] * 2 + [(128, 64)])
    work = float8_work(spec, tokens=32, checkpointing=False, selective=False)
    assert (work.forward_flops, work.backward_flops, work.recompute_flops) == (2_621_440, 5_242_880, 0)
    assert (work.forward_bytes, work.backward_bytes) == (303_104, 233_472)


def test_checkpointing_recomputes_the_forward_casts():
    """Full checkpointing recomputes every converted product and re-casts input (6 B) and weight (5 B):
    233,472 + 303,104 = 536,576 in backward. Selective keeps q, v, gate and down (every other mm: 24,576 of
    40,960 weights), so 0.4 of the forward is recomputed: 1,048,576 FLOPs, 233,472 + 0.4 x 303,104 B."""
    spec = _tiny()
    full = float8_work(spec, tokens=32, checkpointing=True, selective=False)
    assert (full.recompute_flops, full.backward_bytes) == (2_621_440, 536_576)
    sel = float8_work(spec, tokens=32, checkpointing=True, selective=True)
    assert sel.recompute_flops == pytest.approx(1_048_576)
    assert sel.backward_bytes == pytest.approx(233_472 + 0.4 * 303_104)


def test_float8_all_gather_casts_the_shard():
    """FSDP over 4 ranks, resharding (2 all-gathers a micro-batch): the shard's amax 2 B and cast 3 B before
    the forward gather, 5 x 40,960 / 4 = 51,200; in backward its cast again, 3 x 10,240 = 30,720, and the
    gathered fp8 weight copied to column-major, 2 x 40,960 = 81,920. The all-gather moves 40,960 x (2 - 1)
    bytes less, less 7 fp32 scales: 40,932."""
    spec = _tiny()
    work = float8_work(spec, tokens=32, checkpointing=False, selective=False, shards=4, fp8_gathers=2)
    assert (work.forward_bytes, work.backward_bytes) == (98_304 + 51_200, 110_592 + 30_720 + 81_920)
    on = TrainingConfig(float8=True, float8_all_gather=True)
    assert float8_gather_saving_bytes(spec, on) == 40_932
    assert float8_gather_saving_bytes(spec, TrainingConfig(float8=True)) == 0


def test_linears_not_multiples_of_16_stay_bf16():
    """Intermediate 136 (not a multiple of 16): gate, up and down are not converted (torchtitan's
    module_filter_fn); only q, k, v, o: 4 x 4,096 weights, 2 x 16,384 x 32 = 1,048,576 FLOPs forward."""
    work = float8_work(_tiny(intermediate_size=136), tokens=32, checkpointing=False, selective=False)
    assert work.forward_flops == 1_048_576


@pytest.mark.usefixtures("gpu_work_only")
def test_step_time_change_by_hand():
    """One H100 SXM, the tiny model, 32 tokens, no checkpointing. float8 changes the compute by the GEMMs' own
    time: 7,864,320 fp8 FLOPs at 0.78 (torchao's large-GEMM share, above this tiny model's end-to-end
    utilisation) of 1,978.9 instead of 989.4 TFLOPS, plus the casts, 536,576 B at 3,350 GB/s x 0.7:
    7,864,320 x (1 / 1,543.542e12 - 1 / 771.732e12) + 536,576 / 2,345e9 = +2.2372e-7 s; less autocast's bf16
    casts of the 40,960 converted weights, which torchao's Float8Linear skips (it casts the fp32 weight to fp8
    itself): 6 x 40,960 bytes down at 3,350 GB/s x 0.84 and up at x 0.55 (advisor.estimate.autocast_time),
    8.7335e-8 + 1.33384e-7 = 2.20719e-7 s: +3.003e-9 s in all. Still slower: the casts outweigh the GEMMs' saving
    at this size (torchao's README: float8 is slower for small shapes)."""
    spec = _tiny()
    hw, ddp = parse_gpus("1xH100-80GB-SXM"), STRATEGIES["ddp"].on("torch")

    def run(**float8):
        return estimate_step_time(spec, hw, TrainingConfig(seq_len=32, **float8), ddp, micro_batch_size=1,
                                  checkpointing=False)

    bf16, f8 = run(), run(float8=True)
    assert bf16.utilisation < 0.78
    by_hand = (7_864_320 * (1 / 1543.542e12 - 1 / 771.732e12) + 536_576 / 2345e9
               - 6 * 40_960 / (3350e9 * 0.84) - 6 * 40_960 / (3350e9 * 0.55))
    assert by_hand == pytest.approx(3.003e-9, rel=1e-3)
    assert f8.compute_s - bf16.compute_s == pytest.approx(by_hand, rel=1e-6)
    assert f8.peak_tflops == bf16.peak_tflops == 989.4  # MFU stays against the bf16 peak
    assert any("memory is estimated as the bf16 run" in note for note in f8.notes)


def test_json_field_only_when_on():
    """Off (the default), float8 is left out of the JSON, so every plan made before reads the same."""
    assert not {"float8", "float8_all_gather"} & set(TrainingConfig().model_dump(mode="json"))
    dumped = TrainingConfig(float8=True, float8_all_gather=True).model_dump(mode="json")
    assert (dumped["float8"], dumped["float8_all_gather"]) == (True, True)


def test_tensor_parallel_all_gathers_move_fp8():
    """TP 8 in one H100 node, the tiny model (1 block, width 64), micro-batch 1 x 32 tokens, no checkpointing:
    per block and pass (forward, backward) the two sequence-parallel all-gathers of the 32 x 64 activation move
    1 byte an element instead of 2 (torchao's Float8 TP styles); the reduce-scatters stay bf16. The two
    all-gathers move 2 x 2,048 elements, 8,192 B in bf16 and 4,096 B in fp8; a ring over 8 ranks sends 7/8 of
    that over NVLink 4 at 450 GB/s x 0.8: float8 saves 2 passes x 7/8 x 4,096 B / 360e9 B/s = 1.99111e-8 s
    (the latencies are the same)."""
    from advisor.estimate.mesh_time import tp_comm_s
    from advisor.hardware.efficiency import load_efficiency
    from advisor.mesh import ParallelDims

    spec, hw, eff = _tiny(), parse_gpus("8xH100-80GB-SXM"), load_efficiency()
    mesh = ParallelDims(tp=8, dp_shard=1, world_size=8)

    def comm(**float8):
        return tp_comm_s(spec, hw, TrainingConfig(seq_len=32, **float8), eff, mesh, micro_batch_size=1,
                         checkpointing=False)

    assert comm() - comm(float8=True) == pytest.approx(2 * 7 / 8 * 4_096 / 360e9, rel=1e-9)


def test_frozen_weights_skip_their_grad_weight_gemm():
    """--trainable-params 50%: half the weights train, so the fp8 backward is grad_input (2,621,440 FLOPs) plus
    half of grad_weight (1,310,720): 3,932,160, the share count_flops gives the weight gradients."""
    from advisor.planning.api import resolve_trainable

    spec = resolve_trainable(_tiny(), "50%")
    assert spec.trainable_params * 2 == spec.total_params
    assert float8_work(spec, tokens=32, checkpointing=False, selective=False).backward_flops == 3_932_160
