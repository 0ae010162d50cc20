"""A KV cache left on in training (``--use-cache``, advisor.estimate.kv_cache): the bytes counted by hand,
the simulated step with and without the cache, and where it costs nothing. CPU only, no network."""

from __future__ import annotations


import pytest
from advisor.estimate.activations import Dtypes, shape_of
from advisor.estimate.kv_cache import estimate_kv_cache
from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.releases import behaviours_in_force, installed_behaviours
from advisor.model.sources import spec_from_config
from advisor.simulate.step import simulate
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.cli._main import run_main

# 128 wide, 4 heads of 32, 2 KV heads: K/V are 64 wide a token and layer.
GQA_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=128, intermediate_size=352,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=1024, tie_word_embeddings=False, _name_or_path="kv-llama")
TINY_LLAMA = dict(GQA_LLAMA, hidden_size=64, intermediate_size=176, _name_or_path="tiny-llama")
MBS, SEQ = 2, 512
# Worked by hand, micro-batch 2 x 512 tokens = 1,024, 2 layers:
# bf16-mixed (autocast over fp32 weights): the rotated keys are fp32 (the rotary tables come in the residual's
# dtype), so the cache is fp32 beside SDPA's bf16 casts: a layer's K/V = 2 x 2 x 512 x 2 x 32 x 4 = 524,288.
# The bottom block's backward: its own cache appended again (2s: 2 x 524,288), and the top layer, done: its
# 2s K/V (1,048,576) and its key/value path, 1,024 x (fp32 input 512 + normalised 512 + k and v bf16 input
# casts 2 x 256 + rsqrt 4) = 1,576,960, and its k/v weight casts 2 x 128 x 64 x 2 = 32,768:
# 1,048,576 + 1,048,576 + 1,576,960 + 32,768 = 3,706,880.
# That is transformers before 5.24, whose cache casts the values to the keys' fp32. From 5.24.0 the values keep
# their bf16 (profiles/library_releases.json, kv_cache_values_keep_their_dtype): the cached values are the tensor
# SDPA saves. A layer's K 2 x 512 x 64 x 4 = 262,144 (a copy), V 2 x 512 x 64 x 2 = 131,072 (SDPA's own);
# the bottom block's own: 2s keys 524,288 and s values beyond SDPA's s 131,072 = 655,360; the top layer, done:
# 2s K/V 2 x 393,216 = 786,432 and the same path 1,576,960 + 32,768: 655,360 + 786,432 + 1,609,728 = 3,051,520.
# pure bf16 (both releases): the cache is what SDPA saves (2 bytes): a layer's K/V 262,144; the bottom block's
# own 262,144 (its 2s tensor beyond the s SDPA saves); the top layer's 2s K/V 524,288 and its path 1,024 x
# (fp32 copy 512 + normalised 256 + norm output 256 + rsqrt 4) = 1,052,672: 262,144 + 524,288 + 1,052,672 = 1,839,104.
KEEPS_VALUES = installed_behaviours().get("kv_cache_values_keep_their_dtype")  # the installed release's, or None
BOTTOM_BLOCK_BYTES = {"bf16-mixed": 3_051_520 if KEEPS_VALUES else 3_706_880, "bf16": 1_839_104}
# bf16-mixed, no checkpointing: the cache beyond what SDPA saves, 2 layers: fp32 K and V 2 x 524,288 before 5.24;
# fp32 K only, 2 x 262,144, from 5.24.0.
AUTOCAST_AT_LOSS_BYTES = 524_288 if KEEPS_VALUES else 1_048_576


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


def _spec(cfg: dict):
    return spec_from_config(cfg, name=cfg["_name_or_path"], source="local")


def test_cache_bytes_by_hand():
    """layers x 2 (K, V) x batch x seq x kv heads x head dim x bytes, at the loss; the blocks' backward as above."""
    shape = shape_of(_spec(GQA_LLAMA))
    kv = estimate_kv_cache(shape, Dtypes(residual=4, compute=2, input_casts=True), micro_batch_size=MBS,
                           seq_len=SEQ, checkpointing=True, eager=False, values_own_dtype=False)
    assert kv.end_of_forward == kv.loss_backward == 2 * 2 * MBS * SEQ * 2 * 32 * 4 == 1_048_576
    assert kv.block_backward_top == 524_288 + 2 * 524_288  # layer 0's s, the top layer's 2s
    assert kv.block_backward_bottom == 3_706_880
    for keeps in (False, True):  # without autocast keys and values share a dtype: the release changes nothing
        unchecked = estimate_kv_cache(shape, Dtypes(residual=2, compute=2, input_casts=False), micro_batch_size=MBS,
                                      seq_len=SEQ, checkpointing=False, eager=False, values_own_dtype=keeps)
        assert unchecked.end_of_forward == 0  # SDPA saves the cached tensors themselves


@pytest.mark.parametrize("version,at_loss,top,bottom", [
    # before 5.24: fp32 K and V, 524,288 a layer; the top block's backward: layer 0's s and the top layer's 2s
    ("5.23.0", 1_048_576, 524_288 + 2 * 524_288, 3_706_880),
    ("4.57.6", 1_048_576, 524_288 + 2 * 524_288, 3_706_880),
    # from 5.24.0: fp32 K 262,144 and bf16 V 131,072 a layer; the top block's backward: layer 0's 393,216 and the
    # top layer's 2s keys 524,288 and values beyond SDPA's 131,072
    ("5.24.0", 524_288, 393_216 + 524_288 + 131_072, 3_051_520),
    ("5.25.0.dev0", 524_288, 393_216 + 524_288 + 131_072, 3_051_520),
])
def test_cache_bytes_follow_the_release(version, at_loss, top, bottom):
    """The behaviour picked from a version string (the release table), then the bytes under bf16-mixed, by hand
    (the comment above BOTTOM_BLOCK_BYTES): at the loss without checkpointing, and the checkpointed moments."""
    keeps = "kv_cache_values_keep_their_dtype" in behaviours_in_force({"transformers": version})
    shape, mixed = shape_of(_spec(GQA_LLAMA)), Dtypes(residual=4, compute=2, input_casts=True)
    unchecked = estimate_kv_cache(shape, mixed, micro_batch_size=MBS, seq_len=SEQ, checkpointing=False, eager=False,
                                  values_own_dtype=keeps)
    assert unchecked.end_of_forward == at_loss
    kv = estimate_kv_cache(shape, mixed, micro_batch_size=MBS, seq_len=SEQ, checkpointing=True, eager=False,
                           values_own_dtype=keeps)
    # 2 layers x 1,024 tokens x 64 wide x (K 4 + V 4 or 2 bytes): 1,048,576 or 786,432
    assert kv.end_of_forward == kv.loss_backward == 2 * MBS * SEQ * 64 * (4 + (2 if keeps else 4))
    assert (kv.block_backward_top, kv.block_backward_bottom) == (top, bottom)


def test_spec_carries_the_installed_release():
    """The resolver puts the installed release's behaviour into the model's facts (None before 5.24)."""
    assert _spec(GQA_LLAMA).kv_cache_values_own_dtype == KEEPS_VALUES


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_kept_cache_matches_simulated_step(precision):
    """Checkpointing on, the cache left on (torch's checkpoint_wrapper): the simulated step's peak rises by the
    hand-worked bytes, and so does the estimate."""
    peaks, estimates = [], []
    for use_cache in (False, True):
        training = TrainingConfig(seq_len=SEQ, precision=precision, use_cache=use_cache)
        peaks.append(simulate(GQA_LLAMA, world_size=1, strategy="ddp", training=training, micro_batch_size=MBS,
                              checkpointing=True).peak_allocated)
        estimates.append(estimate_memory(_spec(GQA_LLAMA), parse_gpus("1xH100"), training, get_strategy("ddp").on("torch"),
                                         micro_batch_size=MBS, checkpointing=True))
    assert peaks[1] - peaks[0] == BOTTOM_BLOCK_BYTES[precision]
    assert estimates[1].peak_allocated - estimates[0].peak_allocated == BOTTOM_BLOCK_BYTES[precision]
    assert estimates[1].peak_moment == "block_backward"


def test_shared_cache_costs_nothing_without_checkpointing():
    """Pure bf16, SDPA, no checkpointing: the cache holds the tensors SDPA saves and the loop drops it with the
    output, so the simulated peaks are equal, as the estimate says."""
    peaks, estimates = [], []
    for use_cache in (False, True):
        training = TrainingConfig(seq_len=256, precision="bf16", use_cache=use_cache)
        peaks.append(simulate(TINY_LLAMA, world_size=1, strategy="ddp", training=training, micro_batch_size=MBS,
                              checkpointing=False).peak_allocated)
        estimates.append(estimate_memory(_spec(TINY_LLAMA), parse_gpus("1xH100"), training,
                                         get_strategy("ddp").on("torch"), micro_batch_size=MBS,
                                         checkpointing=False).peak_allocated)
    assert peaks[0] == peaks[1] and estimates[0] == estimates[1]


def test_autocast_cache_is_an_fp32_copy_through_the_loss():
    """bf16-mixed, no checkpointing: the cache holds fp32 rotated keys (and, before transformers 5.24, fp32 values)
    beside SDPA's bf16 casts, so the simulated loss rises by every layer's K/V, 2 x (2 x 2 x 512 x 64 x 4) =
    1,048,576 bytes (from 5.24.0 the keys alone, 524,288), and the backward (the output dropped) does not; the
    estimate's end_of_forward rises by the same (why wrap() turns it off)."""
    at_loss, backward, forward_end = [], [], []
    for use_cache in (False, True):
        training = TrainingConfig(seq_len=SEQ, use_cache=use_cache)
        step = simulate(GQA_LLAMA, world_size=1, strategy="ddp", training=training, micro_batch_size=MBS,
                        checkpointing=False, timeline=True)
        at_loss.append(max(s.peak.total for s in step.timeline.segments if s.label == "loss"))
        backward.append(max(s.peak.total for s in step.timeline.segments if s.phase == "backward"))
        forward_end.append(estimate_memory(_spec(GQA_LLAMA), parse_gpus("1xH100"), training,
                                           get_strategy("ddp").on("torch"), micro_batch_size=MBS,
                                           checkpointing=False).at_end_of_forward)
    assert at_loss[1] - at_loss[0] == forward_end[1] - forward_end[0] == AUTOCAST_AT_LOSS_BYTES
    assert backward[0] == backward[1]


def test_eager_cache_under_checkpointing_is_refused(capsys):
    """transformers' eager attention cannot run a kept cache through the recomputation (its (b, 1, s, s) mask
    meets 2s keys): a one-line error, exit 2."""
    training = TrainingConfig(seq_len=SEQ, attention="eager", use_cache=True)
    with pytest.raises(ValueError, match="use_cache = False"):
        estimate_memory(_spec(GQA_LLAMA), parse_gpus("1xH100"), training, get_strategy("ddp").on("torch"),
                        micro_batch_size=MBS, checkpointing=True)
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xH100", "--attention", "eager",
                               "--use-cache", "--activation-checkpointing", "on"], capsys)
    assert code == 2 and "use_cache = False" in err and len(err.strip().splitlines()) == 1


def test_use_cache_off_leaves_the_json_as_before():
    assert "use_cache" not in TrainingConfig().model_dump()
    assert TrainingConfig(use_cache=True).model_dump()["use_cache"] is True


def test_plan_with_a_kept_cache_says_so_and_never_checkpoints_selectively(capsys):
    """Selective checkpointing cannot run a kept cache (simulated: torch.utils.checkpoint raises on the slice the
    recomputation adds): pinned, exit 2; under auto, the planner tries off and full only. The plan states the
    assumption; a default plan says nothing of the cache."""
    from advisor import plan

    # 24,576 tokens: without the cache every strategy runs selective checkpointing within the headroom
    default = plan("Qwen/Qwen2.5-0.5B", "1xH100", seq_len=24576)
    assert any(c.selective_checkpointing for c in default.candidates)
    assert not any("KV cache" in note for note in default.assumptions)
    kept = plan("Qwen/Qwen2.5-0.5B", "1xH100", use_cache=True, seq_len=24576)
    assert not any(c.selective_checkpointing for c in kept.candidates)
    assert any(note.startswith("KV cache kept in training") for note in kept.assumptions)
    assert any(f"{KEEPS_VALUES} (installed)" in note for note in kept.assumptions) is bool(KEEPS_VALUES)
    code, _, err = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xH100", "--use-cache",
                             "--activation-checkpointing", "selective"], capsys)
    assert code == 2 and "selective checkpointing" in err
