"""What the optimizer and the checkpoint's dtype decide before any byte is counted: transformers' Adafactor cannot
step FSDP2's DTensor parameters (tests/simulate/test_optimizer_impl.py runs it), so no FSDP2 strategy is offered with
it; a LoRA base whose config states no dtype (an fp32-era checkpoint: BERT, GPT-2, T5, BART) loads in float32 under
the recipes that load the checkpoint's dtype."""

from __future__ import annotations

import pytest

from advisor.planning.api import plan


def test_adafactor_leaves_fsdp2_unavailable_and_zero1_open():
    result = plan("Qwen/Qwen2.5-0.5B", "2xA100", optimizer="adafactor")
    for name in ("zero2", "zero3", "zero2_offload", "zero3_offload"):
        cand = result.candidate(name)
        assert not cand.available and "DTensor" in cand.unavailable_reason
    assert result.candidate("zero1").available and result.candidate("ddp").available
    assert result.chosen.strategy not in ("zero2", "zero3", "zero2_offload", "zero3_offload")


def test_adafactor_pinned_on_fsdp2_is_an_error_with_the_reason():
    with pytest.raises(ValueError, match="Adafactor cannot step FSDP2"):
        plan("Qwen/Qwen2.5-0.5B", "2xA100", optimizer="adafactor", strategy="zero3")


def test_adafactor_runs_under_fsdp1_and_deepspeed():
    assert plan("Qwen/Qwen2.5-0.5B", "2xA100", optimizer="adafactor", strategy="zero3",
                fsdp_version=1).candidate("zero3").available
    assert plan("Qwen/Qwen2.5-0.5B", "2xA100", optimizer="adafactor", strategy="zero3",
                engine="deepspeed").candidate("zero3").available


def test_adafactor_where_only_sharding_fits_says_why_not_the_sequence():
    """Qwen2.5-14B under Adafactor needs its states sharded (ddp: 190 GiB a GPU at micro-batch 1); FSDP2 cannot step
    Adafactor, so no count of H100s fits, and the sentence names that reason, not the sequence length. Under FSDP1
    the same job fits on these 8 GPUs."""
    result = plan("Qwen/Qwen2.5-14B", "8xH100", optimizer="adafactor")
    assert result.recommendation is None
    reason = result.smallest_fit.reason
    assert reason.sharding_unavailable is not None and "Adafactor cannot step FSDP2" in reason.sharding_unavailable
    sentence = next(line for line in result.why if line.startswith("No number of these GPUs fits"))
    assert "shorten --seq-len" not in sentence and "--fsdp-version 1" in sentence
    meshes = next(x for x in result.reasons if x.kind == "no-mesh-fits")  # not "tried": none could run
    assert meshes.unavailable and any(line.startswith("No mesh can run it either: the ") for line in result.why)
    assert plan("Qwen/Qwen2.5-14B", "8xH100", optimizer="adafactor", fsdp_version=1).recommendation is not None


def test_a_base_whose_config_states_no_dtype_loads_in_float32():
    """bert-large-uncased's config.json states no dtype and its weights are fp32: LoRA over it holds the base in
    float32 (4 bytes a frozen weight) where Qwen2.5's bf16 checkpoint holds 2; --frozen-base compute keeps 2."""
    def base_bytes(model, **options):
        result = plan(model, "1xH100", strategy="ddp", lora=16, precision="bf16-mixed", **options)
        return result.training.frozen_param_bytes, result

    bert, result = base_bytes("google-bert/bert-large-uncased", task="sequence-classification")
    assert bert == 4 and any("frozen base in float32" in note for note in result.assumptions)
    assert base_bytes("Qwen/Qwen2.5-0.5B")[0] == 2
    assert base_bytes("google-bert/bert-large-uncased", task="sequence-classification", frozen_base="compute")[0] == 2


def test_a_dataparallel_fallback_opens_with_the_remedy_that_runs_faster():
    """Qwen2.5-7B under Adafactor on 2 A100s: FSDP2 cannot step it, ddp and zero1 do not fit, so the plan falls back to
    DataParallel (5,278 tokens/s). The first line names what runs faster on the GPUs alone, FSDP1 (zero2 at 8,297
    tokens/s, the --fsdp-version 1 remedy), where it had opened with the unavailable zero3 (the review of issue 19)."""
    result = plan("Qwen/Qwen2.5-7B", "2xA100", optimizer="adafactor")
    assert result.recommendation.strategy == "dp"
    first = result.reasons[0]
    assert first.kind == "single-process-remedy" and first.remedy == "--fsdp-version 1" and first.keeps_math
    fsdp1 = plan("Qwen/Qwen2.5-7B", "2xA100", optimizer="adafactor", fsdp_version=1).chosen
    assert (first.remedy_strategy, first.remedy_tokens_per_s) == (fsdp1.strategy, fsdp1.step_time.tokens_per_s)
    assert first.remedy_tokens_per_s > 1.5 * first.tokens_per_s
    assert result.why[0].startswith("dp (torch.nn.DataParallel: one process drives every GPU")
