"""The planner's reasons carry the numbers their sentences print (issue 22 item 5, issue 19 item 5).

For real plans (the README's first command and its variants), each reason's numbers are compared with
figures worked by hand (parameter counts, the experts' share) or read from the plan's own candidates
and capacity, or from a second plan with the one knob changed (what a saving is measured against).
Then every number in every rendered sentence must be one the reason holds, or plain arithmetic of them
(a share, a ratio, a difference): no sentence can print a figure its data does not carry.
"""

from __future__ import annotations

import re

import pytest

from advisor.planning import reasons as r
from advisor.planning.api import plan
from advisor.planning.candidates import SAME_SPEED
from advisor.planning.render import render
from advisor.units import GIB

QWEN_7B_PARAMS = 7_615_616_512  # Qwen2.5-7B's model card: 7.61B (embeddings 152064 x 3584, untied head)
# LoRA rank 16 on PEFT's qwen2 default targets (q_proj, v_proj): per layer 16 x (3584 + 3584) for q and
# 16 x (3584 + 512) for v (4 key/value heads of 128); 28 layers.
QWEN_7B_LORA_16 = 28 * 16 * ((3584 + 3584) + (3584 + 512))
LLAMA_8B_PARAMS = 8_030_261_248  # Llama 3.1 8B's published count
# Mixtral-8x7B: 32 layers x 8 experts x 3 matrices of 4096 x 14336 (gate, up, down) in the experts.
MIXTRAL_EXPERT_PARAMS = 32 * 8 * 3 * 4096 * 14336


@pytest.fixture(scope="module")
def qwen_2xa100():
    return plan("Qwen/Qwen2.5-7B", "2xA100")


@pytest.fixture(scope="module")
def qwen_trainer():
    return plan("Qwen/Qwen2.5-7B", "2xA100", recipe="trainer")


@pytest.fixture(scope="module")
def qwen_lora_4090():
    # context_gib=1.0 (given): zero3 misses by less than one GPU's default context of 0.5 GiB saves; with 1.0 it
    # does not fit, and neither ddp nor zero1 stays within the headroom (the margin choice these tests read).
    return plan("Qwen/Qwen2.5-7B", "1xRTX4090", lora=16, context_gib=1.0)


@pytest.fixture(scope="module")
def mixtral():
    return plan("mistralai/Mixtral-8x7B-v0.1", "8xH100")


@pytest.fixture(scope="module")
def llama_long():
    return plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=131072)


@pytest.fixture(scope="module")
def qwen72_lora():
    return plan("Qwen/Qwen2.5-72B", "8xH100", lora=16)


@pytest.fixture(scope="module")
def pinned_zero2():
    return plan("Qwen/Qwen2.5-0.5B", "2xA100", strategy="zero2")


@pytest.fixture(scope="module")
def llama_405b_fastest():
    return plan("meta-llama/Llama-3.1-405B", "16x8xH100", seq_len=8192, policy="fastest")


def _one(p, kind):
    (found,) = [x for x in p.reasons if isinstance(x, kind)]
    return found


def test_readme_plan_offloads_and_says_why_in_the_candidates_numbers(qwen_2xa100):
    p = qwen_2xa100
    capacity = p.hardware.gpu_memory_bytes
    opening = _one(p, r.SizeDefault)
    assert (opening.strategy, opening.num_params, opening.band) == ("zero3", QWEN_7B_PARAMS, "medium")
    unfit = _one(p, r.DoesNotFit)
    zero3 = p.candidate("zero3")
    assert (unfit.strategy, unfit.total_bytes, unfit.capacity_bytes) == ("zero3", zero3.memory_bytes.total, capacity)
    assert unfit.total_bytes > unfit.capacity_bytes  # "does not fit" is true of its own numbers
    assert (unfit.micro_batch_size, unfit.checkpointing) == (1, "on")
    up = _one(p, r.Escalated)
    chosen = p.chosen
    assert (up.direction, up.strategy, up.total_bytes) == ("escalated", "zero3_offload", chosen.memory_bytes.total)
    assert up.total_bytes <= capacity and up.micro_batch_size == chosen.micro_batch_size
    assert up.num_fitting_on_gpu == 0  # nothing fits on the GPUs alone: that is why it offloads
    faster = _one(p, r.FasterOffload)
    other = p.candidate("zero2_offload")
    assert (faster.strategy, faster.tokens_per_s, faster.micro_batch_size) == (
        "zero3_offload", chosen.step_time.tokens_per_s, chosen.micro_batch_size)
    assert (faster.instead_of, faster.instead_tokens_per_s, faster.instead_micro_batch_size) == (
        "zero2_offload", other.step_time.tokens_per_s, other.micro_batch_size)
    assert faster.tokens_per_s > faster.instead_tokens_per_s  # "runs ... against ..." is true of its numbers
    ram = _one(p, r.CpuRam)
    assert (ram.cpu_bytes, ram.cpu_capacity_bytes) == (chosen.cpu_memory_bytes, None)
    # The recommendation's reason is the shortfall, the escalation and the faster offload, in that order.
    assert p.recommendation.reasons == (unfit, up, faster)
    assert p.recommendation.reason == " ".join(render(x) for x in (unfit, up, faster))


def test_offload_remedy_saving_is_the_difference_of_two_candidates(qwen_2xa100):
    """'it saves 10.1 GiB per GPU on zero3': zero3 at the reference's micro-batch and checkpointing, with
    and without the fused optimizer step."""
    p = qwen_2xa100
    best = _one(p, r.OffloadRemedy)
    assert p.reasons[0] == best  # it opens the why
    assert (best.remedy, best.reference, best.remedy_strategy, best.remedy_fits) == (
        "--optimizer-impl fused", "zero3", "zero3", True)
    assert best.tokens_per_s == p.chosen.step_time.tokens_per_s
    fused = plan("Qwen/Qwen2.5-7B", "2xA100", optimizer_impl="fused", micro_batch_size=1,
                 activation_checkpointing="on", strategy="zero3").candidate("zero3")
    saved = (p.candidate("zero3").memory_bytes.total - fused.memory_bytes.total) / GIB
    assert best.saved_gib == pytest.approx(saved, abs=0.005)  # Remedy.saved_gib keeps two decimals
    assert "it saves 10.1 GiB per GPU on zero3" in render(best)


def test_loss_note_savings_are_other_kernels_at_the_same_micro_batch(qwen_2xa100):
    p = qwen_2xa100
    note = _one(p, r.LossPeak)
    chosen = p.chosen
    assert (note.strategy, note.total_bytes, note.micro_batch_size) == (
        "zero3_offload", chosen.memory_bytes.total, chosen.micro_batch_size)
    for saving in note.savings:
        other = plan("Qwen/Qwen2.5-7B", "2xA100", loss=saving.kernel, micro_batch_size=chosen.micro_batch_size,
                     activation_checkpointing=chosen.checkpointing, strategy="zero3_offload").candidate("zero3_offload")
        assert saving.saved_bytes == chosen.memory_bytes.total - other.memory_bytes.total
    assert [s.kernel for s in note.savings] == ["chunked", "fused"]


def test_trainer_recipe_default_fits_with_its_share(qwen_trainer):
    p = qwen_trainer
    fits = _one(p, r.DefaultFits)
    zero3 = p.candidate("zero3")
    assert (fits.strategy, fits.total_bytes, fits.capacity_bytes) == (
        "zero3", zero3.memory_bytes.total, p.hardware.gpu_memory_bytes)
    assert fits.total_bytes <= fits.capacity_bytes and fits.micro_batch_size == 1 and fits.checkpointing == "off"
    assert f"({fits.total_bytes / fits.capacity_bytes:.0%})" in render(fits) == p.recommendation.reason
    # zero2 also fits since a finished FSDP2 block reshards in backward (tests/estimate/test_fsdp2_block_backward.py)
    assert [x.kind for x in p.reasons] == ["size-default", "default-fits", "also-fits"]
    also, zero2 = _one(p, r.AlsoFits), p.candidate("zero2")
    assert (also.strategy, also.total_bytes, also.micro_batch_size, also.step_s) == (
        "zero2", zero2.memory_bytes.total, zero2.micro_batch_size, zero2.step_time.step_s)


def test_lora_on_one_4090_takes_the_plain_model(qwen_lora_4090):
    """One GPU: the default is the plain model (ddp), not the size threshold's zero3, which does not fit here."""
    p = qwen_lora_4090
    default = _one(p, r.SizeDefault)
    assert (default.num_params, default.band, default.strategy) == (QWEN_7B_PARAMS + QWEN_7B_LORA_16, "one-gpu", "ddp")
    assert p.candidate("zero3").memory_bytes.total > p.hardware.gpu_memory_bytes
    fits = _one(p, r.DefaultFits)
    assert (fits.strategy, fits.total_bytes) == ("ddp", p.candidate("ddp").memory_bytes.total)
    assert not [x for x in p.reasons if isinstance(x, r.Escalated)]
    margin = _one(p, r.MarginChoice)
    shares = [f.total_bytes / f.capacity_bytes for f in (margin.chosen, margin.runner_up)]
    assert margin.roomy == "neither" and min(shares) > 0.9  # neither stays within 90%
    assert margin.runner_up.total_bytes == p.candidate("zero1").memory_bytes.total
    assert _one(p, r.CheckpointingOn).mode == "on" and p.chosen.activation_checkpointing


def test_mixtral_offloads_and_no_gpu_only_mesh_fits(mixtral):
    p = mixtral
    assert _one(p, r.SizeDefault).band == "large"
    best = _one(p, r.OffloadRemedy)
    # More GPUs help wrap()'s FSDP2: over 16 ranks it shards the 8 experts on dim 1 (torchtitan's rule,
    # wrappers.fsdp.expert_placement_fn), so each rank holds 1/16 of them, where the 8 ranks hold one expert each.
    assert best.remedy == "--gpus 2x8xH100-80GB-SXM" and best.reference == "zero3" and best.keeps_math
    assert best.remedy_fits and best.remedy_strategy == "zero3"
    # accelerate's fully_shard (recipe trainer) pads the experts' dim 0 to the world instead, so each of 16 ranks
    # holds a whole expert of each tensor, as each of 8 does (strategy_buffers.expert_shard_padding, measured on
    # the simulator): more GPUs do not help it (its bf16 reduce-scatter input, accelerate's policy, makes 16 ranks
    # 14% lighter than wrap()'s 8, where dim 1 would halve the experts).
    padded = plan("mistralai/Mixtral-8x7B-v0.1", "2x8xH100", micro_batch_size=1, activation_checkpointing="on",
                  strategy="zero3", recipe="trainer").candidate("zero3")
    assert not padded.fits and padded.memory_bytes.total > 0.85 * p.candidate("zero3").memory_bytes.total
    mesh = _one(p, r.NoGpuOnlyMesh)
    assert mesh.cause.kind == "experts"
    assert mesh.cause.expert_share == pytest.approx(MIXTRAL_EXPERT_PARAMS / p.model.total_params, rel=1e-12)
    assert f"{mesh.cause.expert_share:.0%}" == "97%"  # 45.10B of 46.70B
    closest = next(c for c in p.candidates if c.mesh is not None and c.mesh.label == mesh.mesh_label)
    assert (mesh.total_bytes, mesh.states_bytes) == (closest.memory_bytes.total, closest.memory_bytes.states_total)
    assert mesh.total_bytes > mesh.capacity_bytes == p.hardware.gpu_memory_bytes


def test_long_sequence_mesh_names_the_limit_and_what_cp_buys(llama_long):
    p = llama_long
    assert _one(p, r.SizeDefault).num_params == LLAMA_8B_PARAMS
    forced = _one(p, r.DataParallelCannot)
    m = p.candidate("zero3").memory_bytes
    limit = forced.limit
    assert limit.kind == "activations-and-logits" and limit.activations_bytes + limit.temporary_bytes >= limit.states_bytes
    assert (limit.activations_bytes, limit.temporary_bytes, limit.states_bytes, limit.total_bytes) == (
        m.activations, m.temporary, m.params + m.grads + m.optimizer, m.total)
    fits = _one(p, r.MeshFits)
    # full checkpointing: selective (97% of memory) is past the 10% headroom (advisor.planning.candidates)
    assert (fits.mesh_label, fits.total_bytes, fits.checkpointing) == ("cp 8", p.chosen.memory_bytes.total, "on")
    assert (fits.step_s, fits.tokens_per_s) == (p.chosen.step_time.step_s, p.chosen.step_time.tokens_per_s)
    cp = _one(p, r.DegreeEffect)
    without = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=131072, micro_batch_size=1,
                   activation_checkpointing="on", strategy="zero3").candidate("zero3")
    assert (cp.dim, cp.degree, cp.total_bytes, cp.without_bytes) == ("cp", 8, fits.total_bytes,
                                                                      without.memory_bytes.total)
    assert cp.compare == "unfit" and not without.fits
    assert f"cp 8 saves {(cp.without_bytes - cp.total_bytes) / GIB:.1f} GiB per GPU" in render(cp)
    assert p.recommendation.reasons == (fits, cp)


def test_a_faster_offload_the_policy_passes_over_is_named(qwen72_lora):
    """Qwen2.5-72B LoRA on 8 x H100: zero3 fits only with selective checkpointing, while zero3_offload, its frozen
    bf16 shards (72.7B x 2 B / 8 = 18 GB) resting on the CPU, fits without it. The policy keeps the GPU-only plan;
    the why names the faster offload with the figures of its own candidate, and --policy fastest takes it."""
    p = qwen72_lora
    x = _one(p, r.OffloadNotTaken)
    off, chosen = p.candidate("zero3_offload"), p.chosen
    assert chosen.strategy == "zero3" and x.chosen == "zero3" and x.chosen_tokens_per_s == chosen.step_time.tokens_per_s
    assert (x.strategy, x.tokens_per_s, x.micro_batch_size, x.checkpointing, x.cpu_bytes) == (
        "zero3_offload", off.step_time.tokens_per_s, off.micro_batch_size, "off", off.cpu_memory_bytes)
    assert chosen.selective_checkpointing and x.tokens_per_s > (1 + SAME_SPEED) * x.chosen_tokens_per_s
    assert x not in p.recommendation.reasons  # a note in the why, not the reason for the choice
    fastest = plan("Qwen/Qwen2.5-72B", "8xH100", lora=16, policy="fastest")
    assert fastest.chosen.strategy == "zero3_offload" and not [y for y in fastest.reasons
                                                               if isinstance(y, r.OffloadNotTaken)]
    pinned = plan("Qwen/Qwen2.5-72B", "8xH100", lora=16, strategy="zero3")
    assert not [y for y in pinned.reasons if isinstance(y, r.OffloadNotTaken)]


def test_a_requested_strategy_says_so(pinned_zero2):
    p = pinned_zero2
    assert p.reasons[0] == r.Requested(strategy="zero2")
    assert p.recommendation.reason == "zero2 was requested and fits" and p.why[0] == "zero2 was requested; it fits."
    note = _one(p, r.LossPeak)
    assert note.total_bytes == p.chosen.memory_bytes.total and note.micro_batch_size == p.chosen.micro_batch_size


def test_405b_pipeline_summary_is_the_closest_staged_mesh(llama_405b_fastest):
    p = llama_405b_fastest
    summary = _one(p, r.PipelineSummary)
    staged = [c for c in p.candidates if c.mesh is not None and (c.mesh.pp > 1 or c.mesh.ep > 1)]
    assert not any(c.fits for c in staged) and not summary.fits and summary.cause.kind == "policy-fastest"
    closest = min(staged, key=lambda c: c.memory_bytes.total)
    assert (summary.mesh_label, summary.total_bytes) == (closest.mesh.label, closest.memory_bytes.total)
    assert summary.total_bytes == max(closest.stage_peaks) == closest.stage_peaks[summary.worst_rank]
    assert summary.total_bytes > summary.capacity_bytes
    effects = [x for x in p.reasons if isinstance(x, r.DegreeEffect)]
    assert [(x.dim, x.degree) for x in effects] == [("tp", 4), ("cp", 2)]
    assert all(x.total_bytes == p.chosen.memory_bytes.total < x.without_bytes for x in effects)


# --- every printed number is one the reason holds ------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.\-/~])\d(?:[\d,]*\d)?(?:\.\d+)?")
_TEMPLATE = ("(1-10B)", "(< 1B)", "(> 10B)", "~1/3", "rank 0 first")  # fixed words of a sentence, not figures


def _leaves(model):
    for name, value in model:
        if isinstance(value, r.ReasonModel):
            yield from _leaves(value)
        elif isinstance(value, tuple):
            for item in value:
                yield from (_leaves(item) if isinstance(item, r.ReasonModel) else [(name, item)])
        else:
            yield name, value


def _shown(reason) -> set[str]:
    """The figures a sentence may print: each number as the renderer formats its kind, numbers inside
    names (a mesh label, a flag), and the arithmetic a sentence does on them (a share, a ratio, a saving)."""
    out: set[str] = set()
    leaves = list(_leaves(reason))
    nums = [(n, v) for n, v in leaves if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for name, value in leaves:
        if isinstance(value, str):
            out |= set(_NUMBER.findall(value.replace("x", " ")))
    for name, v in nums:
        out |= {str(v), f"{v:,.0f}", f"{v:.2f}", f"{v:.1f}", f"{v:.0%}"[:-1], f"{1 - v:.0%}"[:-1]}
        if name.endswith("bytes"):
            out.add(f"{v / GIB:.1f}")
        if name == "num_params":
            out |= {f"{v / 1e9:.1f}", f"{v / 1e9:.2g}", f"{v / 1e9:.3g}"}
    by = dict(nums)
    pairs = [("total_bytes", "capacity_bytes"), ("remedy_tokens_per_s", "tokens_per_s"),
             ("slow_batch_s", "fast_batch_s")]
    for a, b in pairs:
        if by.get(a) is not None and by.get(b):
            out |= {f"{by[a] / by[b]:.0%}"[:-1], f"{by[a] / by[b]:.1f}", f"{by[a] / by[b]:.2f}"}
    for f in (getattr(reason, "chosen", None), getattr(reason, "runner_up", None)):
        if isinstance(f, r.Figures):
            out.add(f"{f.total_bytes / f.capacity_bytes:.0%}"[:-1])
    if isinstance(reason, r.DegreeEffect):
        out.add(f"{abs(reason.without_bytes - reason.total_bytes) / GIB:.1f}")
        if reason.step_s is not None and reason.without_step_s is not None:
            out.add(f"{reason.step_s - reason.without_step_s:+.2f}".lstrip("+-"))
    if isinstance(reason, r.HeadroomRemedy):  # the re-plan's share of the same GPU
        out.add(f"{reason.remedy_total_gib * GIB / reason.capacity_bytes:.0%}"[:-1])
    if isinstance(reason, r.OffloadNotTaken):
        out.add(f"{reason.tokens_per_s / reason.chosen_tokens_per_s - 1:+.0%}"[1:-1])
    if isinstance(reason, r.FastestMesh):
        out.add(f"{reason.mesh.tokens_per_s / reason.dp.tokens_per_s - 1:.0%}"[:-1])
    if isinstance(reason, (r.DataParallelCannot,)) and isinstance(reason.limit, r.BatchLimit):
        out.add(str((reason.limit.micro_batch_size or 0) * reason.limit.world_size))
    if isinstance(reason, r.StagePeaks):
        out |= {str(i) for i in range(len(reason.peaks_bytes))}  # "the worst, rank 1"
    return out


@pytest.mark.parametrize("fixture", ["qwen_2xa100", "qwen_trainer", "qwen_lora_4090", "mixtral", "llama_long",
                                     "pinned_zero2", "llama_405b_fastest", "qwen72_lora"])
def test_every_number_in_a_sentence_is_in_its_reason(fixture, request):
    p = request.getfixturevalue(fixture)
    assert len(p.why) == len(p.reasons) and p.why
    for reason, sentence in zip(p.reasons, p.why):
        text = sentence
        for fixed in _TEMPLATE:
            text = text.replace(fixed, "")
        printed = set(_NUMBER.findall(text))
        assert printed <= _shown(reason), (reason.kind, sentence, printed - _shown(reason))


def test_the_number_check_catches_a_figure_the_reason_does_not_hold():
    """The check above is not vacuous: a sentence with one figure changed fails it."""
    fits = r.DefaultFits(strategy="zero3", total_bytes=68 * GIB, capacity_bytes=80 * GIB, micro_batch_size=1,
                         checkpointing="off")
    assert render(fits) == "zero3 fits: 68.0 GiB of 80.0 GiB per GPU (85%) at micro-batch 1."
    assert set(_NUMBER.findall(render(fits))) <= _shown(fits)
    assert not set(_NUMBER.findall(render(fits).replace("68.0", "67.0"))) <= _shown(fits)


def test_kinds_no_readme_plan_reaches_render_as_before():
    """Sentence families the plans above do not reach, with figures chosen to print round: the text the
    planner built as strings before it returned reasons."""
    assert render(r.Unavailable(strategy="dp", detail="DataParallel is one process: one node only")) == (
        "dp is unavailable: DataParallel is one process: one node only.")
    faster = r.FasterOffload(strategy="zero3_offload", tokens_per_s=1234.4, micro_batch_size=4,
                             instead_of="zero2_offload", instead_tokens_per_s=1000.0, instead_micro_batch_size=2)
    assert render(faster) == ("zero3_offload rather than zero2_offload: both offload, and zero3_offload runs 1,234 "
                              "tokens/s (micro-batch 4) against 1,000 (micro-batch 2).")
    peaks = r.StagePeaks(peaks_bytes=(70 * GIB, 72 * GIB + GIB // 2, 68 * GIB))
    assert render(peaks) == "per-stage peaks (GiB, rank 0 first): 70.0, 72.5, 68.0; the worst, rank 1, decides the fit."
    none = r.NoCountFits(checkpointing_tried=True, hints=("shorten --seq-len",))
    assert render(none) == ("No number of these GPUs fits: one sample's activations alone exceed a GPU (with "
                            "activation checkpointing), or offloaded states exceed CPU RAM; shorten --seq-len.")
    passed = r.OffloadNotTaken(strategy="zero3_offload", tokens_per_s=1200.0, micro_batch_size=2, checkpointing="off",
                               cpu_bytes=100 * GIB, chosen="zero3", chosen_tokens_per_s=1000.0)
    assert render(passed) == ("zero3_offload would run faster: 1,200 tokens/s against zero3's 1,000 (+20%) at "
                              "micro-batch 2 without checkpointing, with 100.0 GiB of CPU RAM per node; offload is "
                              "taken only when nothing fits on the GPUs alone (--strategy zero3_offload or --policy "
                              "fastest runs it).")
    also = r.AlsoFits(strategy="ddp", total_bytes=61 * GIB, capacity_bytes=100 * GIB, micro_batch_size=2, step_s=1.2)
    assert render(also) == "ddp also fits (61% of memory, micro-batch 2, 1.20 s/step) and communicates less"


def test_checkpointing_for_speed_within_the_headroom_says_so(qwen_2xa100):
    """The README plan checkpoints though zero3_offload fits without it within the headroom: the reason is the
    larger micro-batch's speed, and its figures are the plan pinned without checkpointing (it said "past the 10%
    headroom" of a plan at 71% before)."""
    p = qwen_2xa100
    x = _one(p, r.CheckpointingForHeadroom)
    off = plan("Qwen/Qwen2.5-7B", "2xA100", strategy="zero3_offload",
               activation_checkpointing="off").candidate("zero3_offload")
    assert (x.micro_batch_size, x.total_bytes, x.tokens_per_s) == (
        off.micro_batch_size, off.memory_range.at("expected"), off.step_time.tokens_per_s)
    assert x.total_bytes <= (1 - x.headroom) * x.capacity_bytes and x.chosen_tokens_per_s > x.tokens_per_s
    assert "runs faster" in render(x) and "past the" not in render(x)


def test_a_degrees_effect_is_measured_at_the_steps_own_global_batch():
    """Qwen2.5-7B under the Trainer recipe on 8 x A100 40GB, 128 samples a step: the plan runs zero3 on cp 4 x tp 2,
    128 accumulation steps. What tp 2 buys is measured against cp 4 with the same 128 samples a step (64 steps of two
    data-parallel ranks, which the Trainer's no_sync holds unsharded gradients for), the candidate `advisor plan` gives
    with --cp 4 --tp 1 pinned at the same micro-batch and checkpointing; it was measured at one micro-batch a step,
    which fitted and was said to take 0.61 s against the plan's 40 s. Without --global-batch the two meshes' steps
    hold different numbers of samples, so the time clause compares tokens/s."""
    job = dict(seq_len=8192, recipe="trainer")
    p = plan("Qwen/Qwen2.5-7B", "8xA100-40GB", global_batch_size=128, **job)
    assert p.chosen.mesh.label == "cp 4 x tp 2"
    (tp,) = [x for x in p.reasons if isinstance(x, r.DegreeEffect) and x.dim == "tp"]
    pinned = plan("Qwen/Qwen2.5-7B", "8xA100-40GB", global_batch_size=128, cp=4, tp=1,
                  micro_batch_size=p.chosen.micro_batch_size, activation_checkpointing=p.chosen.checkpointing or "off",
                  **job)
    without = next(c for c in pinned.candidates if c.mesh is not None and c.mesh.label == "dp_shard 2 x cp 4")
    assert (tp.without_bytes, tp.compare, without.fits) == (without.memory_bytes.total, "unfit", False)
    # Llama 3.1 8B at 8,192 tokens on 8 x H100, zero3 on dp_shard 4 x tp 2 against zero3 alone (which fits), no
    # --global-batch: one sample a step per data-parallel rank, 4 against 8, so tokens/s are compared
    from advisor.mesh import ParallelDims
    from advisor.planning.candidates import evaluate_candidate
    from advisor.planning.meshes import degree_effects

    base = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=8192, micro_batch_size=1, activation_checkpointing="on")
    mesh = evaluate_candidate(base.model, base.hardware, base.training, "zero3",
                              ParallelDims(dp_shard=4, tp=2, world_size=8))
    alone = base.candidate("zero3")
    (effect,) = degree_effects(base.model, base.hardware, base.training, mesh)
    assert alone.fits and (effect.dim, effect.compare) == ("tp", "tokens")
    assert (effect.without_tokens_per_s, effect.without_bytes) == (alone.step_time.tokens_per_s,
                                                                  alone.memory_bytes.total)
