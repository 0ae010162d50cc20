"""Properties of the choice over randomly drawn jobs (bundled models, GPU kinds and counts, sequence,
micro-batch, LoRA, precision, activation offloading). They are statements about the policy, so they compare the
recommendation with the candidates' own fit flags and ranges: the estimate itself is tested elsewhere."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from advisor.hardware.catalog import load_catalog
from advisor.planning.api import plan
from advisor.strategies import STRATEGIES

MODELS = ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-14B",
          "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "google/gemma-2-2b", "openai-community/gpt2",
          "mistralai/Mistral-7B-v0.1")
GPUS = {g.name: g for g in load_catalog().gpus}


def _offloads(candidate) -> bool:
    impl = STRATEGIES[candidate.strategy].on(candidate.engine)
    return impl.offload_params or impl.offload_optimizer


@st.composite
def jobs(draw) -> dict:
    gpu = draw(st.sampled_from(sorted(GPUS)))
    precision = draw(st.sampled_from(("bf16-mixed", "bf16", "fp16-mixed", "fp32")))
    if GPUS[gpu].bf16_tflops is None and precision.startswith("bf16"):
        precision = "fp16-mixed"  # a GPU without bf16 refuses a pinned bf16 (tested in test_plan_messages)
    job = dict(model=draw(st.sampled_from(MODELS)), gpus=f"{draw(st.sampled_from((1, 2, 4, 8)))}x{gpu}",
               seq_len=draw(st.sampled_from((512, 2048, 8192))), precision=precision)
    micro = draw(st.sampled_from((None, None, 1, 4)))
    if micro is not None:
        job["micro_batch_size"] = micro
    if draw(st.booleans()):
        job["lora"] = 16
    if draw(st.integers(0, 3)) == 0:  # a quarter of the jobs: the block inputs in CPU memory
        job["activation_offload"] = True
    if draw(st.booleans()):
        job["headroom"] = draw(st.sampled_from((0.0, 0.05, 0.2)))
    if draw(st.booleans()):
        job["margin"] = draw(st.sampled_from(("low", "high")))
    return job


_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(jobs())
# Found by this test: DataParallel was the one GPU-only fit (on one GPU it calls the module itself) and, being
# outside the escalation, was passed over for zero2_offload.
@example({"model": "meta-llama/Llama-3.2-1B", "gpus": "1xA100-80GB-PCIE", "seq_len": 8192, "precision": "fp32",
          "activation_offload": True, "margin": "high"})
def test_offload_only_when_no_gpu_only_candidate_fits(job):
    """Meshes included: a dense model's offload is kept over a GPU-only mesh only where every mesh that fits does
    so past the --headroom alone, and the offload within it or faster (the reason offload-kept-over-mesh says so)."""
    result = plan(job.pop("model"), job.pop("gpus"), trace=False, **job)
    chosen = result.chosen
    if chosen is None or not _offloads(chosen):
        return
    on_gpu = [c for c in result.candidates if c.fits and not _offloads(c)]
    if any(x.kind == "offload-kept-over-mesh" for x in result.reasons):
        # the one exception: GPU-only meshes that fit only past the --headroom, where the offload is within it (or
        # past it too and faster)
        training, rate = result.training, chosen.step_time.tokens_per_s
        roomy = chosen.memory_range.at(training.margin) <= (1 - training.headroom) * chosen.capacity_bytes
        for c in on_gpu:
            assert c.mesh is not None, f"{chosen.strategy} recommended while {c.strategy} fits on the GPUs alone"
            assert c.memory_range.at(training.margin) > (1 - training.headroom) * c.capacity_bytes, c.mesh.label
            assert roomy or c.step_time.tokens_per_s < rate, c.mesh.label
        return
    assert not on_gpu, f"{chosen.strategy} recommended while {[c.strategy for c in on_gpu]} fit on the GPUs alone"


@_SETTINGS
@given(jobs())
def test_auto_micro_batch_stays_within_the_headroom(job):
    """Past micro-batch 1 (below which there is nothing to give up), every fitting candidate's automatic
    micro-batch leaves ``headroom`` of the GPU free at the ``--margin`` end of its range."""
    job.pop("micro_batch_size", None)
    result = plan(job.pop("model"), job.pop("gpus"), trace=False, **job)
    training = result.training
    for c in result.candidates:
        if c.fits and c.micro_batch_size > 1:
            used = c.memory_range.at(training.margin)
            assert used <= (1 - training.headroom) * c.capacity_bytes, (
                f"{c.strategy} micro-batch {c.micro_batch_size}: {used / 2**30:.2f} GiB at the {training.margin} end "
                f"of {c.capacity_bytes / 2**30:.2f} GiB with headroom {training.headroom}")


@_SETTINGS
@given(jobs())
def test_no_gpu_only_plan_is_both_faster_and_smaller_than_the_recommendation(job):
    """The size thresholds give way to a plan that is faster (tokens/s more than SAME_SPEED of the faster rate
    above: ``policy.as_fast``, the measure the 'as fast' sentences use too) and needs no more memory."""
    from advisor.planning.policy import as_fast

    result = plan(job.pop("model"), job.pop("gpus"), trace=False, **job)
    chosen = result.chosen
    if chosen is None or chosen.step_time is None or _offloads(chosen):
        return
    better = [c.strategy for c in result.candidates if c.fits and c.step_time is not None and not _offloads(c)
              and c.strategy in STRATEGIES and c.step_time.tokens_per_s > chosen.step_time.tokens_per_s
              and not as_fast(c.step_time.tokens_per_s, chosen.step_time.tokens_per_s)
              and c.memory_bytes.total <= chosen.memory_bytes.total]
    assert not better, f"{chosen.strategy} recommended while {better} is faster and needs no more memory"


@_SETTINGS
@given(jobs())
def test_a_candidate_past_the_headroom_is_one_no_checkpointing_mode_brings_within_it(job):
    """Auto checkpointing keeps the headroom: a data-parallel candidate past ``1 - headroom`` of memory at the
    ``--margin`` end is the best its strategy can do there, so the same strategy with full checkpointing, at the
    same micro-batch (or its own automatic one), is past the headroom too or does not fit."""
    micro = job.get("micro_batch_size")
    model, gpus = job.pop("model"), job.pop("gpus")
    result = plan(model, gpus, trace=False, **job)
    training = result.training
    for c in result.candidates:
        if not c.fits or c.mesh is not None or c.checkpointing == "on":
            continue
        limit = (1 - training.headroom) * c.capacity_bytes
        if c.memory_range.at(training.margin) <= limit:
            continue
        full = plan(model, gpus, trace=False, **{**job, "strategy": c.strategy, "activation_checkpointing": "on"})
        other = full.candidate(c.strategy)
        assert not other.fits or other.memory_range.at(training.margin) > limit, (
            f"{c.strategy} {c.checkpointing} mb {c.micro_batch_size} past the headroom while full checkpointing "
            f"(mb {other.micro_batch_size}, micro-batch pinned: {micro}) stays within it")


@_SETTINGS
@given(jobs())
# found by this property (2026-11-29): the offload step called zero3_offload faster, 470 against 456 tokens/s, more
# than 3% of the slower, while the headroom rule called the pair as fast, within 3% of the faster
@example({"model": "mistralai/Mistral-7B-v0.1", "gpus": "1xA100-40GB-PCIE", "seq_len": 8192, "precision": "bf16",
          "micro_batch_size": 1})
def test_the_why_never_prefers_each_of_two_plans_to_the_other(job):
    """No 'A rather than B' beside 'B rather than A' (the headroom and dominance rules once judged one pair
    with two different references), and no 'communicates less' on one GPU, where nothing communicates."""
    import re

    one_gpu = job["gpus"].startswith("1x")
    result = plan(job.pop("model"), job.pop("gpus"), trace=False, **job)
    pairs = {m.groups() for m in (re.match(r"(\S+) rather than (\S+):", line) for line in result.why) if m}
    assert not [(a, b) for a, b in pairs if (b, a) in pairs], result.why
    assert not (one_gpu and any("communicates less" in line for line in result.why)), result.why
