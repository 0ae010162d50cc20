"""Planning on device meshes: when meshes are searched, what wins, what the 'why' and JSON say, and
bad degrees refused with one line and exit code 2."""

from __future__ import annotations

import json

import pytest

from advisor.planning.api import plan
from advisor.planning.meshes import MeshPins, enumerate_meshes
from advisor.model.sources import resolve_model
from advisor.hardware.cluster import parse_gpus
from advisor.training import TrainingConfig
from tests.cli._main import run_main


def test_long_context_8b_fits_on_a_mesh_where_no_data_parallel_strategy_does(capsys):
    code, out, _ = run_main(["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--seq-len", "131072",
                             "--json"], capsys)
    doc = json.loads(out)
    assert code == 0
    dp = [c for c in doc["candidates"] if c["mesh"] is None]
    assert dp and not any(c["fits"] for c in dp)  # today's answer: nothing in the DP family fits
    rec = doc["recommendation"]
    mesh = rec["mesh"]
    assert mesh["cp"] * mesh["tp"] > 1 and mesh["dp_replicate"] * mesh["dp_shard"] * mesh["cp"] * mesh["tp"] == 8
    chosen = next(c for c in doc["candidates"] if c["mesh"] == mesh and c["strategy"] == rec["strategy"])
    assert chosen["fits"] and chosen["memory_bytes"]["total"] <= chosen["capacity_bytes"]
    assert rec["activation_checkpointing"]
    why = " ".join(doc["why"])
    assert "the limit is activations" in why and f"cp {mesh['cp']} saves" in why


def test_70b_fastest_picks_a_mesh_and_shows_fsdp_alone_beside_it():
    fastest = plan("meta-llama/Llama-3.1-70B", "4x8xH100", seq_len=8192, policy="fastest")
    default = plan("meta-llama/Llama-3.1-70B", "4x8xH100", seq_len=8192)
    # The thresholds policy keeps the data-parallel family when it fits; fastest takes the faster mesh.
    assert default.recommendation.mesh is None and default.recommendation.strategy == "zero3"
    rec = fastest.recommendation
    assert rec.mesh is not None and rec.mesh.tp * rec.mesh.cp > 1
    mesh_rate = fastest.chosen.step_time.tokens_per_s
    fsdp_rate = fastest.candidate("zero3").step_time.tokens_per_s
    assert mesh_rate > 1.03 * fsdp_rate
    assert rec.alternatives and rec.alternatives[0].startswith("zero3 alone")
    assert f"{fsdp_rate:,.0f} tokens/s" in rec.alternatives[0]


def test_pinned_degrees_are_honoured():
    p = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=32768, tp=2, cp=2)
    assert (p.recommendation.mesh.tp, p.recommendation.mesh.cp, p.recommendation.mesh.dp_shard) == (2, 2, 2)
    assert all(c.mesh is None or (c.mesh.tp, c.mesh.cp) == (2, 2) for c in p.candidates)
    hsdp = plan("meta-llama/Llama-3.1-8B", "2x8xH100", seq_len=8192, hybrid=2)
    assert hsdp.recommendation.mesh.dp_replicate == 2
    assert any(c.mesh is not None and (c.mesh.dp_shard, c.mesh.tp, c.mesh.cp) == (8, 1, 1) for c in hsdp.candidates)


def test_enumerated_meshes_follow_the_practitioners_rules():
    spec = resolve_model("Qwen/Qwen2.5-7B")  # 28 heads, 4 KV heads: tp in {1, 2, 4}
    meshes = enumerate_meshes(spec, parse_gpus("2x8xH100"), TrainingConfig(seq_len=4096))
    assert {m.tp for m in meshes} == {1, 2, 4}
    assert all(m.tp * m.cp <= 8 and m.world_size == 16 and not m.is_data_parallel_only for m in meshes)
    assert all(m.dp_replicate in (1, 2) for m in meshes)
    # accelerate refuses TP/CP with replicas and dp_shard 1, and FSDP2 with nothing to shard.
    assert not any(m.dp_replicate > 1 and m.dp_shard == 1 for m in meshes)
    assert all(m.dp_shard * m.cp >= 2 for m in meshes)
    assert enumerate_meshes(spec, parse_gpus("8xH100"), TrainingConfig(seq_len=4096), MeshPins(cp=4)) \
        and all(m.cp == 4 for m in enumerate_meshes(spec, parse_gpus("8xH100"), TrainingConfig(seq_len=4096),
                                                      MeshPins(cp=4)))


def test_smallest_fit_searches_meshes():
    p = plan("meta-llama/Llama-3.1-70B", "8xH100", seq_len=131072)
    assert p.recommendation is None
    assert p.smallest_fit.mesh is not None and p.smallest_fit.mesh.cp > 1
    assert p.smallest_fit.num_gpus == p.smallest_fit.mesh.world_size


@pytest.mark.parametrize("args, constraint", [
    (["-m", "meta-llama/Llama-3.1-8B", "--tp", "3"], "--tp 3 does not divide the 8 GPUs"),
    (["-m", "meta-llama/Llama-3.1-8B", "--tp", "2", "--cp", "4", "--hybrid", "2"],
     "--tp 2 x --cp 4 x --hybrid 2 = 16 does not divide the 8 GPUs"),
    # FSDP1 runs no tp or cp (accelerate's parallelism_config is FSDP2's): said, not planned as FSDP2
    (["-m", "meta-llama/Llama-3.1-8B", "--tp", "2", "--fsdp-version", "1"], "--tp 2 needs FSDP2"),
    # only the degrees FSDP1 cannot run are named (replicas it can: HYBRID_SHARD)
    (["-m", "meta-llama/Llama-3.1-8B", "--cp", "2", "--hybrid", "2", "--fsdp-version", "1"], ": --cp 2 needs FSDP2"),
    (["-m", "Qwen/Qwen2.5-7B", "--tp", "8"], "does not divide the model's 28 attention heads"),
    (["-m", "meta-llama/Llama-3.1-8B", "--cp", "2", "--attention", "eager"], "needs SDPA attention"),
    (["-m", "google-bert/bert-base-uncased", "--cp", "2"], "needs a Llama-like attention decoder"),
    (["-m", "meta-llama/Llama-3.1-8B", "--tp", "8"], "nothing for FSDP2 to shard"),
    (["-m", "meta-llama/Llama-3.1-8B", "--cp", "2", "--strategy", "ddp"], "cannot run on a mesh"),
])
def test_bad_degrees_one_line_exit_2(capsys, args, constraint):
    code, out, err = run_main(["plan", "-g", "8xH100", "--seq-len", "4096", *args], capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and constraint in lines[0], lines
    assert "validation error" not in lines[0]


def test_table_and_recommendation_line_name_the_mesh(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # full mesh names (a narrow terminal shortens them: tests/cli/test_render.py)
    code, out, _ = run_main(["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--seq-len", "131072"], capsys)
    assert code == 0
    assert "zero3 cp 8 *" in out and "Recommendation: zero3 (torch) on mesh cp 8" in out


def test_degrees_pinned_to_one_plan_data_parallelism():
    """``--tp 1 --cp 1 --strategy zero3`` (what an exported DP plan reads back as) said "No mesh with the pinned
    degrees fits" although zero3 fits: degrees of 1 pin data parallelism alone, the data-parallel plan."""
    from advisor.planning.api import plan

    job = dict(seq_len=8192, strategy="zero3")
    pinned = plan("meta-llama/Llama-3.1-8B", "8xH100", tp=1, cp=1, **job).recommendation
    free = plan("meta-llama/Llama-3.1-8B", "8xH100", **job).recommendation
    assert pinned is not None and pinned.mesh is None
    assert (pinned.strategy, pinned.micro_batch_size) == (free.strategy, free.micro_batch_size) == ("zero3", 1)


def test_fsdp1_searches_no_tensor_or_context_parallel_mesh():
    """Under --fsdp-version 1 (accelerate's fsdp_version: 1) the mesh search keeps to data parallelism and
    replicas: Llama-3.1-8B at 131,072 tokens fits 8 x H100 only on a cp mesh under FSDP2, and nothing under FSDP1."""
    fsdp2 = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=131072)
    assert fsdp2.recommendation.mesh is not None and fsdp2.recommendation.mesh.cp > 1
    fsdp1 = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=131072, fsdp_version=1)
    assert all(c.mesh is None or (c.mesh.tp, c.mesh.cp) == (1, 1) for c in fsdp1.candidates)
    assert fsdp1.recommendation is None or fsdp1.recommendation.mesh is None


@pytest.mark.parametrize("pins", [{"pp": 1}, {"ep": 1}, {"pp": 1, "ep": 1}])
def test_a_degree_of_one_pins_no_pipeline(pins):
    """--pp 1 / --ep 1 say 'no pipeline' / 'no expert split': the plan is the one without them (--pp 1 said 'No mesh
    with --pp 1 fits' for Llama-3.1-8B on 8 x H100, where zero2 fits)."""
    base = plan("meta-llama/Llama-3.1-8B", "8xH100")
    pinned = plan("meta-llama/Llama-3.1-8B", "8xH100", **pins)
    assert pinned.recommendation is not None
    assert (pinned.recommendation.strategy, pinned.recommendation.mesh, pinned.recommendation.micro_batch_size) == (
        base.recommendation.strategy, base.recommendation.mesh, base.recommendation.micro_batch_size)
    assert all(c.mesh is None or (c.mesh.pp, c.mesh.ep) == (1, 1) for c in pinned.candidates)


def test_pp_one_keeps_the_fastest_search_to_one_stage():
    """Under --policy fastest the search tries pp 2 to 16 on Llama-3.1-70B on 4 x 8 x H100; with --pp 1 none."""
    searched = {c.mesh.pp for c in plan("meta-llama/Llama-3.1-70B", "4x8xH100", policy="fastest").candidates if c.mesh}
    kept = {c.mesh.pp for c in plan("meta-llama/Llama-3.1-70B", "4x8xH100", policy="fastest", pp=1).candidates
            if c.mesh}
    assert max(searched) > 1 and kept == {1}


def _offloads(candidate) -> bool:
    return candidate.strategy.endswith("_offload")


def test_a_gpu_only_mesh_replaces_a_data_parallel_plan_that_only_offloads():
    """Llama 3.1 8B at 32,768 tokens on 4 x A100: zero3 alone needs 90.4 GiB (the fp32 logits of one sample), so the
    data-parallel family runs it only as zero3_offload; a context-parallel mesh runs it on the GPUs alone within the
    headroom, and is the plan (never offload while a GPU-only plan fits). The why names the offload it replaces,
    with that candidate's own tokens/s."""
    p = plan("meta-llama/Llama-3.1-8B", "4xA100", seq_len=32768)
    rec, chosen = p.recommendation, p.chosen
    assert rec.strategy == "zero3" and rec.mesh is not None and rec.mesh.cp > 1
    assert chosen.memory_bytes.total <= 0.9 * chosen.capacity_bytes
    offload = next(c for c in p.candidates if c.strategy == "zero3_offload" and c.mesh is None)
    assert offload.fits and not next(c for c in p.candidates if c.strategy == "zero3" and c.mesh is None).fits
    assert chosen.step_time.tokens_per_s > offload.step_time.tokens_per_s
    opening = (f"Data parallelism alone runs this only with CPU offload (zero3_offload, "
               f"{offload.step_time.tokens_per_s:,.0f} tokens/s); on the GPUs alone the limit is activations")
    samples = offload.micro_batch_size * 4  # the offload plan's step, which the mesh keeps (4 accumulation steps)
    assert [w for w in p.why if w.startswith(opening) and w.endswith(
        f"The mesh is planned at the offload plan's {samples} samples a step (--global-batch {samples}).")]
    assert chosen.micro_batch_size * chosen.gradient_accumulation_steps * chosen.mesh.dp == samples


def test_no_mesh_is_searched_where_zero3s_optimizer_step_alone_overfills_the_gpu():
    """The README's first command: zero3 needs 70.93 GiB allocated at its optimizer step (7.62B parameters' shard of
    the states, 56.7 GiB, and foreach AdamW's 14.19 GiB temporary), 79.56 GiB with the allocator's gap and the
    context, above the A100's 79.15. Every mesh holds at least that shard and that step, so none can fit and none
    is searched: the plan offloads, as before, and lists no mesh candidate."""
    p = plan("Qwen/Qwen2.5-7B", "2xA100")
    zero3 = next(c for c in p.candidates if c.strategy == "zero3")
    assert zero3.memory_bytes.peak_moment == "optimizer_step" and zero3.memory_bytes.total > zero3.capacity_bytes
    assert p.recommendation.strategy == "zero3_offload" and not [c for c in p.candidates if c.mesh is not None]


def _samples(candidate, world: int = 8) -> int:
    """Samples a step: micro-batch x accumulation x the data-parallel ranks (``world`` GPUs)."""
    dp = candidate.mesh.dp if candidate.mesh is not None else world
    return candidate.micro_batch_size * (candidate.gradient_accumulation_steps or 1) * dp


def test_an_offload_within_the_headroom_is_kept_over_a_mesh_past_it_however_fast():
    """Qwen2.5-14B at 16,384 tokens on 4 x A100 under the torchtitan recipe with --headroom 0.2: zero3_offload at
    micro-batch 1 (4 samples a step) uses 54% of the card; the fastest GPU-only mesh, cp 4, fits only past the 20%
    headroom, at those 4 samples and at its own micro-batch (84%), though faster (a review found such meshes replacing
    offloads at 99-100%). The offload stays; the reason gives both rates, each the candidate's own, and names --policy
    fastest, which takes the faster mesh (it does). --headroom 0 (the user's own setting) lets the mesh replace it."""
    job = dict(seq_len=16384, recipe="torchtitan")
    p = plan("Qwen/Qwen2.5-14B", "4xA100", headroom=0.2, **job)
    assert p.recommendation.strategy == "zero3_offload" and p.recommendation.mesh is None
    assert p.chosen.memory_range.at("expected") <= 0.8 * p.chosen.capacity_bytes
    (kept,) = [x for x in p.reasons if x.kind == "offload-kept-over-mesh"]
    mesh = next(c for c in p.candidates if c.mesh is not None and c.mesh.label == kept.mesh_label)
    assert mesh.fits and kept.total_bytes == mesh.memory_range.at("expected") > 0.8 * mesh.capacity_bytes
    assert _samples(mesh, 4) == kept.samples_per_step == _samples(p.chosen, 4) == 4
    assert kept.tokens_per_s == mesh.step_time.tokens_per_s > 1.03 * p.chosen.step_time.tokens_per_s
    assert kept.offload_tokens_per_s == p.chosen.step_time.tokens_per_s and kept.fastest_takes_mesh
    assert any(w.endswith("the offload is kept; --policy fastest takes the mesh.") for w in p.why)
    assert all(c.memory_range.at("expected") > 0.8 * c.capacity_bytes for c in p.candidates
               if c.mesh is not None and c.fits)
    own = plan("Qwen/Qwen2.5-14B", "4xA100", cp=4, headroom=0.2, **job).chosen  # cp 4 at its own micro-batch
    assert own.memory_range.at("expected") > 0.8 * own.capacity_bytes and _samples(own, 4) < 4
    fastest = plan("Qwen/Qwen2.5-14B", "4xA100", policy="fastest", headroom=0.2, **job)
    assert fastest.chosen.mesh.label == kept.mesh_label
    roomy = plan("Qwen/Qwen2.5-14B", "4xA100", headroom=0.0, **job)
    assert roomy.chosen.mesh.label == kept.mesh_label and roomy.chosen.step_time.tokens_per_s == kept.tokens_per_s


def test_a_mesh_that_fits_only_at_its_own_samples_replaces_the_offload_and_says_so():
    """Qwen2.5-14B at 16,384 tokens on 4 x A100 under the Trainer recipe (a review's case): the offload steps on
    micro-batch 1 x 4 GPUs = 4 samples, samples the user never asked for. At 4 samples a cp 4 mesh accumulates 4
    micro-batches, and the Trainer's last-micro-batch sync holds unsharded gradients, so no mesh fits within the
    headroom there; at its own micro-batch cp 4 does (89%), and faster. Never offload while a GPU-only plan fits within
    the user's settings: the mesh is the plan, and the why says at which samples, and which --global-batch plans at
    the offload's (where, here, no mesh fits within the headroom and the plan offloads)."""
    job = dict(seq_len=16384, recipe="trainer")
    p = plan("Qwen/Qwen2.5-14B", "4xA100", **job)
    offload = next(c for c in p.candidates if c.strategy == "zero3_offload" and c.mesh is None)
    chosen = p.chosen
    assert chosen.mesh is not None and chosen.memory_range.at("expected") <= 0.9 * chosen.capacity_bytes
    assert not chosen.gradient_accumulation_steps or chosen.gradient_accumulation_steps == 1
    assert _samples(offload, 4) == 4 and _samples(chosen, 4) == chosen.micro_batch_size * chosen.mesh.dp == 1
    assert chosen.step_time.tokens_per_s > offload.step_time.tokens_per_s
    assert any(w.endswith("At the offload plan's 4 samples a step no mesh fits within the headroom (--global-batch 4 "
                          "plans at them); the mesh steps on its own 1 sample.") for w in p.why)
    at_four = plan("Qwen/Qwen2.5-14B", "4xA100", global_batch_size=4, **job)
    assert at_four.recommendation.strategy == "zero3_offload"
    assert all(not c.fits or c.memory_range.at("expected") > 0.9 * c.capacity_bytes
               for c in at_four.candidates if c.mesh is not None)
    # --policy fastest kept the offload here (no mesh at 4 samples is faster), slower than the default's mesh
    fastest = plan("Qwen/Qwen2.5-14B", "4xA100", policy="fastest", **job)
    assert fastest.chosen.mesh == chosen.mesh and fastest.chosen.step_time.tokens_per_s == chosen.step_time.tokens_per_s
    assert any(w.endswith("At the offload plan's 4 samples a step no mesh is faster (--global-batch 4 plans at them); "
                          "the mesh steps on its own 1 sample.") for w in fastest.why)
    assert plan("Qwen/Qwen2.5-14B", "4xA100", policy="fastest", global_batch_size=4, **job).chosen.mesh is None


def test_a_mesh_within_the_headroom_replaces_a_faster_offload_and_says_it_is_slower():
    """Qwen2.5-14B on 8 x A100-40GB with fused AdamW: a cp 2 x tp 4 mesh fits within the headroom at the offload
    plan's 48 samples a step but runs slower than zero3_offload. Never offload while a GPU-only plan fits within the
    user's settings: the mesh is the plan, and one line says by how much it is slower, with both rates, and what
    --policy fastest takes instead (a faster mesh past the headroom, which it does take)."""
    p = plan("Qwen/Qwen2.5-14B", "8xA100-40GB-SXM", optimizer_impl="fused")
    offload = next(c for c in p.candidates if c.strategy == "zero3_offload" and c.mesh is None)
    assert p.chosen.mesh is not None and p.chosen.memory_bytes.total <= 0.9 * p.chosen.capacity_bytes
    assert _samples(p.chosen) == _samples(offload) == p.training.global_batch_size == 48
    (slower,) = [x for x in p.reasons if x.kind == "mesh-slower-than-offload"]
    assert slower.tokens_per_s == p.chosen.step_time.tokens_per_s < 0.97 * offload.step_time.tokens_per_s
    assert slower.offload_tokens_per_s == offload.step_time.tokens_per_s
    share = 1 - slower.tokens_per_s / slower.offload_tokens_per_s
    fastest = plan("Qwen/Qwen2.5-14B", "8xA100-40GB-SXM", optimizer_impl="fused", policy="fastest").chosen
    assert fastest.step_time.tokens_per_s > offload.step_time.tokens_per_s  # a mesh past the headroom, at 48 samples
    assert fastest.memory_range.at("expected") > 0.9 * fastest.capacity_bytes and _samples(fastest) == 48
    assert any(w.startswith(f"zero3 on mesh {p.chosen.mesh.label} runs {share:.0%} slower than zero3_offload")
               and w.endswith(f"--policy fastest takes mesh {fastest.mesh.label}.") for w in p.why)


def test_a_mesh_that_replaces_an_offload_keeps_its_samples_a_step():
    """The torchtune recipe's Llama-3.1-70B on 8 x H100 (a review's case): zero3_offload steps on 14 x 8 = 112
    samples; the mesh that would replace it stepped on 4 (micro-batch 1 on dp_shard 4 x tp 2) at 99% of the card.
    At the offload plan's 112 samples no mesh fits within the headroom, so the offload stays, as it does where
    --global-batch 112 is asked (the same decision), and as --headroom 0.2 asks."""
    p = plan("meta-llama/Llama-3.1-70B", "8xH100", recipe="torchtune")
    asked = plan("meta-llama/Llama-3.1-70B", "8xH100", recipe="torchtune", global_batch_size=_samples(p.chosen))
    assert p.recommendation.strategy == asked.recommendation.strategy == "zero3_offload"
    assert all(_samples(c) == 112 for c in p.candidates if c.mesh is not None and c.micro_batch_size)
    assert plan("meta-llama/Llama-3.1-70B", "8xH100", recipe="torchtune", headroom=0.2).chosen.mesh is None


def test_a_recipe_plans_only_the_mesh_degrees_its_stack_runs(capsys):
    """profiles/recipes.json mesh_dims: accelerate's ParallelismConfig (the Trainer) has dp_replicate, dp_shard, tp
    and cp sizes, no pipeline or expert degree; Lightning's snippet writes FSDP2 and HSDP. A pinned zero3 of
    Mixtral-8x7B under the Trainer was planned on a pp x ep mesh the Trainer cannot run (a helper's docs review);
    now no candidate has a degree its recipe lacks, and a pinned one is one line, exit 2."""
    mixtral = plan("mistralai/Mixtral-8x7B-v0.1", "8xH100", nodes=2, strategy="zero3", micro_batch_size=1,
                   recipe="trainer")
    meshes = [c.mesh for c in mixtral.candidates if c.mesh is not None]
    assert meshes and all(m.pp == 1 and m.ep == 1 for m in meshes)
    assert mixtral.recommendation is None or mixtral.recommendation.mesh is None
    from advisor.planning.pipeline_meshes import pipeline_meshes

    default = plan("mistralai/Mixtral-8x7B-v0.1", "8xH100", nodes=2, strategy="zero3", micro_batch_size=1)
    assert pipeline_meshes(default.model, default.hardware, default.training)  # the torch recipe: pp and ep searched
    assert not pipeline_meshes(mixtral.model, mixtral.hardware, mixtral.training)
    long = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=131072, recipe="lightning")
    assert not [c for c in long.candidates if c.mesh is not None and (c.mesh.cp > 1 or c.mesh.tp > 1)]
    for args, named in ((["--tp", "2", "--recipe", "lightning"], "--tp 2: the lightning recipe's stack does not run "
                                                                 "tensor parallelism"),
                        (["--pp-schedule", "zbv", "--recipe", "trainer"], "--pp-schedule zbv: the trainer recipe's "
                                                                          "stack does not run pipeline stages"),
                        # Ulysses is not modelled on the DeepSpeed engine: a listed cp was never plannable (a review)
                        (["--cp", "2", "--recipe", "deepspeed"], "--cp 2: the deepspeed recipe's stack does not run "
                                                                 "context parallelism")):
        code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", *args], capsys)
        assert code == 2 and not out and err.count("\n") == 1 and named in err, err
    # export: the format's own reason, which names the format that can carry it
    code, _, err = run_main(["export", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--tp", "2", "--format",
                             "lightning", "-o", "-"], capsys)
    assert code == 2 and err.count("\n") == 1 and "the lightning format cannot express the pinned tp" in err


def test_a_mesh_plan_whose_peak_is_the_loss_says_what_each_kernel_saves():
    """Llama 3.1 8B at 262,144 tokens on 8 x H100 runs on cp 8 at 99% of the card, the hf loss's fp32 logits its
    peak; the plan now says what --loss chunked and fused save there (it said it for data-parallel plans only), each
    the cp 8 plan with that kernel pinned (--cp 8 at the same micro-batch and checkpointing)."""
    p = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=262144)
    assert p.chosen.mesh.label == "cp 8" and p.chosen.memory_bytes.total > 0.9 * p.chosen.capacity_bytes
    (peak,) = [x for x in p.reasons if x.kind == "loss-peak"]
    assert (peak.mesh_label, peak.total_bytes) == ("cp 8", p.chosen.memory_bytes.total)
    for saving in peak.savings:
        pinned = plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=262144, cp=8, loss=saving.kernel,
                      micro_batch_size=p.chosen.micro_batch_size, activation_checkpointing=p.chosen.checkpointing)
        assert pinned.chosen.mesh.label == "cp 8"
        assert saving.saved_bytes == peak.total_bytes - pinned.chosen.memory_bytes.total
    assert any(w.startswith("the loss decides the peak of zero3 on mesh cp 8") for w in p.why)


def test_the_smallest_fit_under_a_global_batch_tries_the_node_counts_that_divide_it():
    """A review: Llama-3.1-70B at 16k under the Trainer with --global-batch 3 on 8 x H100 said no number of GPUs fits
    and to shorten --seq-len; counts doubled whole nodes (16, 32), whose data-parallel ranks never divide 3. Three nodes
    (24 GPUs) hold it on a mesh with 3 data-parallel ranks, as the plan there shows."""
    job = dict(seq_len=16384, recipe="trainer", global_batch_size=3)
    p = plan("meta-llama/Llama-3.1-70B", "8xH100", **job)
    assert p.recommendation is None and p.smallest_fit.num_gpus == 3 * 8
    there = plan("meta-llama/Llama-3.1-70B", "3x8xH100", **job).chosen
    assert there.mesh is not None and there.mesh.dp == 3 and not there.strategy.endswith("offload")
    assert p.smallest_fit.mesh.dp == 3


def test_where_the_global_batch_is_the_limit_the_sentence_says_so():
    """Llama-3.1-70B at 16k under the Trainer (no pipeline), --global-batch 1: every count steps on one data-parallel
    rank, whose cp x tp ranks inside a node cannot hold 70B's states; the sentence said to shorten --seq-len. Without
    the batch, 16 H100s hold it on a mesh with 2 data-parallel ranks (the plan on 2 x 8 with those degrees pinned shows
    it), and the sentence names --global-batch as the limit."""
    job = dict(seq_len=16384, recipe="trainer")
    p = plan("meta-llama/Llama-3.1-70B", "8xH100", global_batch_size=1, **job)
    reason = p.smallest_fit.reason
    assert p.smallest_fit.num_gpus is None and reason.global_batch_size == 1
    without = reason.without_batch  # these 8 offload; 16 hold it on the GPUs alone
    assert (without.num_gpus, without.current, without.strategy) == (8, True, "zero3_offload")
    assert (without.gpu_only_gpus, without.gpu_only_mesh) == (16, "dp_shard 2 x cp 4 x tp 2")
    assert p.smallest_fit.message.startswith("No count of these GPUs above 8 fits at --global-batch 1")
    assert "without it, zero3_offload fits on these 8 x H100-80GB-SXM" in p.smallest_fit.message
    assert "--seq-len" not in p.smallest_fit.message
    assert plan("meta-llama/Llama-3.1-70B", "8xH100", **job).chosen.strategy == "zero3_offload"
    there = plan("meta-llama/Llama-3.1-70B", "2x8xH100", cp=4, tp=2, **job).chosen
    assert there is not None and there.mesh.dp == 2 and there.fits
    with pytest.raises(ValueError, match="--global-batch 1 is not divisible"):
        plan("meta-llama/Llama-3.1-70B", "2x8xH100", global_batch_size=1, **job)


def test_the_smallest_fit_tries_pipeline_meshes():
    """A review: Qwen2.5-14B at 16k on RTX 4090s under torchtitan, --global-batch 1, said no number of GPUs fits while
    a pipeline holds the one sample on 16 of them (pp 4 x tp 4: the plan on 4 x 4 picks it)."""
    job = dict(seq_len=16384, recipe="torchtitan", global_batch_size=1)
    p = plan("Qwen/Qwen2.5-14B", "4xRTX4090", **job)
    assert p.smallest_fit.num_gpus == 16 and p.smallest_fit.mesh.pp > 1
    there = plan("Qwen/Qwen2.5-14B", "4x4xRTX4090", **job).chosen
    assert there.mesh == p.smallest_fit.mesh and there.fits


def test_the_gpu_only_clause_of_a_smallest_fit_names_its_micro_batch():
    """A review: with --micro-batch 4 the sentence "Without offload, 8 x A100 would fit with zero3 on mesh dp_shard 4 x
    cp 2" held only at micro-batch 1 (the count search relaxes the micro-batch); it now says so, and that plan fits."""
    job = dict(seq_len=16384, recipe="trainer", global_batch_size=4)
    reason = plan("Qwen/Qwen2.5-14B", "4xA100", micro_batch_size=4, **job).smallest_fit.reason
    assert (reason.gpu_only_gpus, reason.gpu_only_mesh, reason.gpu_only_micro_batch) == (8, "dp_shard 4 x cp 2", 1)
    assert "dp_shard 4 x cp 2 at micro-batch 1." in plan("Qwen/Qwen2.5-14B", "4xA100", micro_batch_size=4,
                                                         **job).smallest_fit.message
    there = plan("Qwen/Qwen2.5-14B", "8xA100", micro_batch_size=1, cp=2, **job).chosen
    assert there.fits and there.mesh.label == "dp_shard 4 x cp 2" and not there.strategy.endswith("offload")


def test_a_hybrid_pin_is_never_dropped_for_a_pipeline():
    """A review: ``--hybrid 2 --global-batch 3`` on 2 x 8 H100 planned pp 4 x tp 4 (no replicas) and said "Pinned degrees:
    --hybrid 2"; ``--hybrid 2 --pp 2`` planned pp 2 x dp_shard 8. Pipeline meshes are planned without HSDP replicas, so
    the first is the batch refusal (2 replicas cannot split 3 samples) and the second names the clash."""
    with pytest.raises(ValueError, match="--global-batch 3 is not divisible"):
        plan("Qwen/Qwen2.5-7B", "2x8xH100", global_batch_size=3, hybrid=2)
    with pytest.raises(ValueError, match="--hybrid 2 with --pp 2: pipeline and expert meshes are planned with FSDP2 "
                                         "over dp_shard only"):
        plan("Qwen/Qwen2.5-7B", "2x8xH100", hybrid=2, pp=2)
    assert plan("Qwen/Qwen2.5-7B", "2x8xH100", global_batch_size=4, hybrid=2).chosen.mesh.dp_replicate == 2


def test_without_the_global_batch_the_plans_own_gpus_are_tried_too():
    """A review: Qwen2.5-7B at 32k on 2 x 8 L4 with --global-batch 1 said "without it, 32 x L4 would fit" while these 16
    hold it without the batch (the plan there: a mesh with 2 data-parallel ranks); and Mixtral-8x7B at 32k with
    --global-batch 3 was "no number fits" while 6 nodes do, pp 16 x dp_shard 3 (48 GPUs: 3 x 2^4, not a divisor of 3
    in whole nodes). Not the fewest there are: pp 16 x cp 2 runs it on 32 when pinned, but the pipelines the planner
    searches unpinned keep cp at 1 (advisor.planning.pipeline_meshes), and the smallest fit searches what it plans."""
    p = plan("Qwen/Qwen2.5-7B", "2x8xL4", seq_len=32768, global_batch_size=1)
    without = p.smallest_fit.reason.without_batch
    assert (without.num_gpus, without.current) == (16, True)
    here = plan("Qwen/Qwen2.5-7B", "2x8xL4", seq_len=32768).chosen
    assert here.fits and here.mesh.label == without.mesh_label
    mixtral = plan("mistralai/Mixtral-8x7B-v0.1", "2x8xH100", seq_len=32768, global_batch_size=3)
    assert mixtral.smallest_fit.num_gpus == 48 and mixtral.smallest_fit.mesh.dp == 3
    there = plan("mistralai/Mixtral-8x7B-v0.1", "6x8xH100", seq_len=32768, global_batch_size=3).chosen
    assert there is not None and there.fits and there.mesh.dp == 3


def test_the_smallest_fit_names_no_mesh_whose_tp_and_cp_span_nodes():
    """A review: with --pp 2 --cp 8 pinned on 8-GPU L4 nodes the smallest fit named pp 2 x cp 8 x tp 4 on 64 GPUs, a mesh
    the planner refuses (tp x cp = 32 ranks span nodes). Every mesh it names keeps tp x cp inside a node."""
    p = plan("Qwen/Qwen2.5-7B", "2x8xL4", seq_len=32768, global_batch_size=1, pp=2, cp=8)
    fit = p.smallest_fit
    assert fit.mesh is None or fit.mesh.tp * fit.mesh.cp <= 8
    with pytest.raises(ValueError, match="span more than one node"):
        plan("Qwen/Qwen2.5-7B", "8x8xL4", seq_len=32768, global_batch_size=1, pp=2, cp=8, tp=4)


def test_a_pinned_degree_no_power_of_two_divides_gets_its_multiples_tried():
    """A review: Llama-3.1-70B at 1,024 tokens on L4 nodes with --pp 5 and --global-batch 8 said no number of GPUs fits;
    the counts tried (whole nodes doubling, a divisor of the batch times a power of two) are never a multiple of 5. 20
    nodes (160 = 5 x 32) run it on pp 5 x dp_shard 4 x tp 8, as the plan there shows."""
    job = dict(seq_len=1024, global_batch_size=8, pp=5)
    p = plan("meta-llama/Llama-3.1-70B", "5x8xL4", **job)
    assert p.smallest_fit.num_gpus == 20 * 8 and p.smallest_fit.mesh.pp == 5
    there = plan("meta-llama/Llama-3.1-70B", "20x8xL4", **job).chosen
    assert there is not None and there.fits and there.mesh.pp == 5
