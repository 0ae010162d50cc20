"""The choice: size thresholds, escalation, overrides honoured, nothing-fits answers, DP's GPU0."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from advisor.planning.api import plan
from advisor.cli.main import cli
from advisor.strategies import STRATEGIES


def test_small_model_gets_ddp():
    p = plan("Qwen/Qwen2.5-0.5B", "2xA100")
    assert p.recommendation.strategy == "ddp" and p.fits


def test_mid_model_gets_full_sharding():
    # 4 A100s: on 2, zero3's 10P optimizer step plus the 1 GiB CUDA context no longer fits
    # (tests/planning/test_plan_cases.py), so the size default escalates to offload there.
    p = plan("Qwen/Qwen2.5-7B", "4xA100")
    assert p.recommendation.strategy == "zero3"
    assert "1-10B" in p.why[0]


def test_large_model_escalates_to_offload_only_when_nothing_on_gpu_fits():
    p = plan("Qwen/Qwen2.5-72B", "8xA100")
    on_gpu = [c for c in p.candidates if "offload" not in c.strategy]
    assert not any(c.fits for c in on_gpu)
    assert p.recommendation.strategy.endswith("offload")
    assert any("does not fit" in line for line in p.why)


def test_default_not_fitting_escalates_with_reason():
    p = plan("Qwen/Qwen2.5-0.5B", "2xT4", seq_len=4096)
    assert p.recommendation is not None and p.recommendation.strategy != "ddp"
    assert any(line.startswith("ddp does not fit") for line in p.why)


def test_cheaper_alternative_is_shown():
    # On 8 H100s zero2 is now as fast and roomy at its headroom-bounded micro-batch, so it is chosen
    # there; on 4 A100s zero2 fits only at micro-batch 1, slower per token than zero3.
    p = plan("Qwen/Qwen2.5-7B", "4xA100")
    assert p.recommendation.strategy == "zero3"
    assert any("also fits" in a for a in p.recommendation.alternatives)


def test_overrides_are_used_exactly():
    p = plan("meta-llama/Llama-3.1-8B", "8xH100", strategy="zero2", micro_batch_size=3,
             activation_checkpointing="on")
    (cand,) = p.candidates
    assert (cand.strategy, cand.micro_batch_size, cand.activation_checkpointing) == ("zero2", 3, True)


@pytest.mark.parametrize(("reserve_gib", "fits"), [(4.67, True), (4.68, False)])
def test_fit_boundary_worked_by_hand(reserve_gib, fits):
    """Qwen2.5-7B (P = 7,615,616,512) zero3 on 2 A100s peaks at the optimizer step with 10P =
    76,156,165,120 bytes (tests/planning/test_memory_views.py), whatever the micro-batch; with 5%
    fragmentation that is 79,963,973,376. The A100 has 84,987,740,160 bytes, so the runtime reserve
    may be up to 5,023,766,784 bytes = 4.679 GiB: 4.67 GiB fits, 4.68 GiB does not. context_gib=0: the
    reserve is then the whole fixed overhead, as when this was worked (the old semantics)."""
    zero3 = plan("Qwen/Qwen2.5-7B", "2xA100", strategy="zero3", reserve_gib=reserve_gib,
                 fragmentation=0.05, context_gib=0).candidate("zero3")
    assert zero3.fits is fits


def test_nothing_fits_names_smallest_gpu_count():
    p = plan("meta-llama/Llama-3.1-405B", "8xA100", cpu_memory_gib=1024)
    assert p.recommendation is None
    assert p.smallest_fit.num_gpus is not None and p.smallest_fit.num_gpus > 8
    bigger = plan("meta-llama/Llama-3.1-405B", f"{p.smallest_fit.num_gpus}xA100", cpu_memory_gib=1024,
                  strategy=p.smallest_fit.strategy, micro_batch_size=1)
    assert bigger.recommendation is not None


def test_dataparallel_gpu0_is_the_bottleneck():
    """48-layer Qwen2.5-14B classifier, frozen backbone, two A100s: GPU0 under DataParallel needs
    more than any GPU under DDP, because it gathers both replicas' logits and computes the loss."""
    common = dict(trainable_params=5120 * 2, micro_batch_size=1, activation_checkpointing="on")
    p = plan("Qwen/Qwen2.5-14B", "2xA100", **common)
    assert p.model.num_layers == 48
    dp, ddp = p.candidate("dp"), p.candidate("ddp")
    gap = dp.memory_bytes.total - ddp.memory_bytes.total
    assert gap > 0
    assert dp.memory_bytes.activations > ddp.memory_bytes.activations  # the gathered logits


def test_dp_is_single_node_only():
    p = plan("Qwen/Qwen2.5-0.5B", "2x8xH100")
    dp = p.candidate("dp")
    assert not dp.available and "one node" in dp.unavailable_reason


def test_deepspeed_engine_lists_dp_unavailable():
    p = plan("Qwen/Qwen2.5-7B", "8xH100", engine="deepspeed")
    assert not p.candidate("dp").available
    assert all(p.candidate(n).available for n in STRATEGIES if n != "dp")


def test_global_batch_sets_accumulation():
    p = plan("Qwen/Qwen2.5-0.5B", "4xH100", global_batch_size=64, micro_batch_size=4)
    assert p.recommendation.gradient_accumulation_steps == 4
    # 30 samples cannot give 4 data-parallel ranks whole micro-batches: a mesh with 2 data-parallel ranks
    # (30 / 2 = 15 per rank) is planned instead; a model with no mesh layout (BERT) still raises.
    meshed = plan("Qwen/Qwen2.5-0.5B", "4xH100", global_batch_size=30)
    assert meshed.recommendation.mesh is not None and meshed.recommendation.mesh.dp == 2
    assert any("the global batch" in line for line in meshed.why)
    with pytest.raises(ValueError, match="divisible"):
        plan("google-bert/bert-base-uncased", "4xH100", global_batch_size=30)


def test_misspelled_option_is_an_error():
    with pytest.raises(ValueError):
        plan("Qwen/Qwen2.5-0.5B", "2xA100", optimiser="sgd")


def test_trainable_share_and_count():
    p = plan("Qwen/Qwen2.5-7B", "2xA100", trainable_params="1%")
    assert p.model.trainable_params == 76_156_165  # 1% of 7,615,616,512, rounded
    with pytest.raises(ValueError):
        plan("Qwen/Qwen2.5-7B", "2xA100", trainable_params="101%")


def test_cli_json_shape_and_exit_codes():
    runner = CliRunner()
    result = runner.invoke(cli, ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert set(doc) >= {"model", "hardware", "training", "candidates", "recommendation"}
    assert {"name", "total_params", "trainable_params"} <= set(doc["model"])
    assert {"gpu", "gpu_memory_bytes", "gpus_per_node", "nodes", "interconnect"} <= set(doc["hardware"])
    assert {"optimizer", "precision", "seq_len", "engine"} <= set(doc["training"])
    cand = doc["candidates"][0]
    assert {"strategy", "engine", "fits", "available", "micro_batch_size", "activation_checkpointing",
            "cpu_memory_bytes", "step_time_s", "memory_bytes"} <= set(cand)
    assert {"params", "grads", "optimizer", "activations", "temporary", "peak_allocated", "runtime_overhead",
            "total"} <= set(doc["candidates"][3]["memory_bytes"])
    assert {"peak_moment", "states_params", "states_grads", "states_optimizer", "states_total",
            "states_on_cpu"} <= set(doc["candidates"][3]["memory_bytes"])
    labels = {"peak_phase", "peak_moment", "states_on_cpu"}
    assert all(isinstance(v, int) for k, v in doc["candidates"][3]["memory_bytes"].items() if k not in labels)
    assert {"strategy", "engine", "micro_batch_size", "activation_checkpointing", "reason"} <= set(doc["recommendation"])


def test_cli_nothing_fits_exit_3():
    result = CliRunner().invoke(cli, ["plan", "--model", "meta-llama/Llama-3.1-405B", "--gpus", "2xT4", "--json",
                                      "--cpu-memory-gib", "256"])
    assert result.exit_code == 3
    assert json.loads(result.output)["recommendation"] is None


def test_cli_table_mentions_recommendation_and_assumptions():
    result = CliRunner().invoke(cli, ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--verbose"])
    assert result.exit_code == 0
    # zero3 no longer fits 2 A100s with the CUDA context (tests/planning/test_plan_cases.py): offload.
    assert "Recommendation: zero3_offload" in result.output and "A100-80GB-SXM" in result.output
    assert "Assumptions" in result.output and "% of 79.15 GiB" in result.output


def test_cli_size_only_model():
    result = CliRunner().invoke(cli, ["plan", "--params", "7.5B", "--gpus", "8xA100", "--json"])
    doc = json.loads(result.output)
    assert doc["model"]["total_params"] == 7_500_000_000
    assert any("Llama-like" in a for a in doc["assumptions"])


def test_fastest_policy_picks_most_tokens_per_second_and_says_why():
    """The fastest data-parallel candidate; a mesh only when faster than it by more than SAME_SPEED (3%,
    advisor/planning/meshes.py _faster)."""
    p = plan("Qwen/Qwen2.5-7B", "2x8xA100-40GB", policy="fastest", global_batch_size=256)
    fitting = [c for c in p.candidates if c.fits]
    best_dp = max(c.step_time.tokens_per_s for c in fitting if c.mesh is None)
    best_mesh = max(c.step_time.tokens_per_s for c in fitting if c.mesh is not None)
    chosen = p.chosen
    assert chosen.mesh is None and chosen.step_time.tokens_per_s >= best_dp * 0.995
    assert best_mesh <= 1.03 * chosen.step_time.tokens_per_s
    assert any("tokens/s" in line for line in p.why)
    assert any(line.startswith("The fastest mesh") and "not faster by more than 3%" in line for line in p.why)


def test_fitting_candidates_carry_step_time():
    p = plan("Qwen/Qwen2.5-7B", "8xH100")
    for c in p.candidates:
        assert (c.step_time_s is not None) == c.fits
        if c.fits:
            assert 0 < c.step_time.mfu < 1 and c.step_time.tokens_per_s > 0


def test_gpu_only_plan_before_offload_on_either_side_of_the_default():
    """Issue 19: Qwen2.5-7B LoRA 16 in pure bf16 on one RTX 4090. The size default, zero3, does not fit
    (FSDP's gathered units and its buffers on top of a whole model on one GPU), ddp does: the plan
    recommended zero3_offload because the escalation only looked past the default. context_gib=1.25: one
    GPU's FSDP2 copies its parameters without all-gather buffers (advisor.estimate.fsdp2_one_rank), so zero3
    fits at 1.0 GiB (100%) and at one GPU's default 0.5 GiB, where the headroom policy, not the escalation,
    picks ddp; 1.25 GiB keeps zero3 out and ddp in. Since 2026-11-27 one GPU's default is the plain model
    itself (ddp), which fits: no escalation, no offload. At 91% of the card, past the headroom, the first reason
    names the remedy that leaves it (--loss fused)."""
    p = plan("Qwen/Qwen2.5-7B", "1xRTX4090", lora=16, precision="bf16", context_gib=1.25)
    assert not p.candidate("zero3").fits and p.candidate("ddp").fits
    assert p.recommendation.strategy == "ddp"
    assert [x.kind for x in p.reasons][:3] == ["headroom-remedy", "size-default", "default-fits"]


def test_cpu_ram_line_says_whether_it_was_checked():
    """Qwen2.5-7B on 2 A100s offloads; the CPU RAM line said 'checked only when --cpu-memory-gib is given'
    even when it was given."""
    given = plan("Qwen/Qwen2.5-7B", "2xA100", cpu_memory_gib=1024)
    line = next(line for line in given.why if "of CPU RAM per node" in line)
    assert "of 1024.0 GiB given by --cpu-memory-gib" in line and "checked only when" not in line
    unchecked = plan("Qwen/Qwen2.5-7B", "2xA100")
    assert any("(checked only when --cpu-memory-gib is given)" in line for line in unchecked.why)


def test_auto_micro_batch_says_it_sets_the_step_batch_without_a_global_batch():
    """The auto micro-batch moves the optimizer step's batch when no --global-batch fixes it (the README plan's
    offload runs micro-batch 15: 30 samples a step on 2 GPUs); the assumption says so, and not when one is given."""
    from advisor import plan

    free = plan("Qwen/Qwen2.5-7B", "2xA100")
    fixed = plan("Qwen/Qwen2.5-7B", "2xA100", global_batch_size=32)
    said = "give --global-batch to fix it"
    assert any(said in note for note in free.assumptions)
    assert not any(said in note for note in fixed.assumptions)
    assert fixed.chosen.micro_batch_size * 2 * (fixed.chosen.gradient_accumulation_steps or 1) == 32


def test_the_smallest_fit_is_a_count_the_global_batch_runs_on():
    """Llama-3.1-8B at 32,768 tokens with --global-batch 7 on 2 x A100 fits nothing (7 samples do not split over 2
    GPUs, and no 2-GPU mesh holds it). The answer named 3 x A100 with zero3_offload (7 % 3: --gpus 3xA100 exits 2)
    and dp_shard 2 x cp 2 on 4 (7 % 2 data-parallel ranks; a review); now a count, and a mesh, whose data-parallel
    ranks divide 7, which the planner then runs: cp 4 on 4 A100s."""
    p = plan("meta-llama/Llama-3.1-8B", "2xA100", seq_len=32768, global_batch_size=7)
    fit = p.smallest_fit
    assert p.recommendation is None and fit.num_gpus == 4 and fit.mesh is not None and 7 % fit.mesh.dp == 0
    again = plan("meta-llama/Llama-3.1-8B", f"{fit.num_gpus}xA100", seq_len=32768, global_batch_size=7)
    assert again.chosen.strategy == fit.strategy and again.chosen.mesh == fit.mesh
