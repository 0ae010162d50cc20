"""Issue 19's message fixes: bf16 on GPUs without it, a pinned strategy the engine cannot run, and the
smallest GPU count that really fits."""

from __future__ import annotations

import pytest

from advisor.cli.main import main
from advisor.planning.api import plan


def _run(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("gpus", ["4xV100", "2xT4"])
def test_default_precision_on_a_gpu_without_bf16_is_fp16_mixed(gpus):
    """profiles/gpus.json gives V100 and T4 no bf16 rate (Volta and Turing have no bf16 tensor cores)."""
    p = plan("Qwen/Qwen2.5-3B", gpus)
    assert p.training.precision == "fp16-mixed"
    notes = [line for line in p.assumptions if "no bf16" in line]
    assert len(notes) == 1 and notes[0].startswith("precision fp16-mixed: the ")
    assert not any(line.startswith("precision bf16-mixed (default)") for line in p.assumptions)


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_pinned_bf16_on_a_gpu_without_it_is_bad_input(precision, capsys):
    code, err = _run(["plan", "-m", "Qwen/Qwen2.5-3B", "-g", "4xV100", "--precision", precision], capsys)
    assert code == 2 and f"--precision {precision}: the V100-16GB has no bf16" in err and "Traceback" not in err


def test_a_pinned_strategy_the_engine_cannot_run_is_bad_input(capsys):
    """It exited 3 with '4 x A100 would fit', as if more GPUs could make DeepSpeed run DataParallel."""
    code, err = _run(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "--strategy", "dp", "--engine", "deepspeed"],
                     capsys)
    assert code == 2 and "DeepSpeed has no single-process DataParallel mode" in err and "would fit" not in err


def test_smallest_fit_within_a_server_is_not_a_power_of_two():
    """Qwen2.5-7B (P = 7,615,616,512) with 8 GiB of CPU RAM, so nothing offloads. zero3's optimizer step
    holds 16P/N of states plus AdamW's 4P/N temporary: 20P/2 = 76.2 GB does not fit two A100s (with the
    allocator gap and context, 79.56 of 79.15 GiB: tests/planning/test_plan_cases.py), 20P/3 = 50.8 GB
    (about 53.5 GiB with the gap and context) fits three. The old search tried 4, 8, 16 after 2."""
    p = plan("Qwen/Qwen2.5-7B", "2xA100", cpu_memory_gib=8)
    assert p.recommendation is None
    assert (p.smallest_fit.num_gpus, p.smallest_fit.strategy) == (3, "zero3")


def test_smallest_fit_counts_whole_nodes_not_doublings():
    """Llama-3.1-405B (P = 405,853,388,800), zero3_offload with 1500 GiB of CPU RAM per node: a node holds
    8 ranks x 20P/N bytes of offloaded states (tests/planning/test_plan_cases.py), 160P/N. At 40 GPUs that
    is 4P = 1,623 GB > 1500 GiB (1,611 GB); at 48, 3.33P = 1,353 GB fits. zero3 on the GPUs alone needs
    16P/N <= 79 GiB, N >= 77. So 48 (six nodes); doubling whole nodes said 64."""
    p = plan("meta-llama/Llama-3.1-405B", "8xA100", cpu_memory_gib=1500)
    assert p.recommendation is None
    assert (p.smallest_fit.num_gpus, p.smallest_fit.strategy) == (48, "zero3_offload")


def test_a_fixed_strategy_that_does_not_fit_names_what_fits_on_the_plans_own_gpus():
    """--strategy ddp pins one candidate, so the others were never tried on these GPUs: the smallest-fit search
    tries them there first, on the cluster as given. Qwen2.5-7B on 2 A100s under the Trainer's fused AdamW: zero3
    fits (69.5 GiB, the README's --recipe trainer plan); under the torch recipe zero3 is 0.4 GiB short (the
    foreach temporary: test_smallest_fit_within_a_server_is_not_a_power_of_two) and zero3_offload fits, with 3
    GPUs named for zero3 alone. Qwen2.5-72B on 3 nodes of 4 (12 GPUs): zero3_offload fits those 12, which a
    search by whole nodes of 8 (8, then 16) never evaluates."""
    trainer = plan("Qwen/Qwen2.5-7B", "2xA100", strategy="ddp", recipe="trainer")
    assert trainer.recommendation is None
    assert trainer.smallest_fit.message == "zero3 fits on these 2 x A100-80GB-SXM at micro-batch 1."
    torch_recipe = plan("Qwen/Qwen2.5-7B", "2xA100", strategy="ddp")
    assert torch_recipe.smallest_fit.message == ("zero3_offload fits on these 2 x A100-80GB-SXM at micro-batch 1. "
                                                 "Without offload, 3 x A100-80GB-SXM would fit with zero3 at micro-batch 1.")
    nodes = plan("Qwen/Qwen2.5-72B", "4xA100", nodes=3, strategy="ddp")
    assert (nodes.smallest_fit.num_gpus, nodes.smallest_fit.strategy) == (12, "zero3_offload")
    assert nodes.smallest_fit.message.startswith("zero3_offload fits on these 12 x A100-80GB-SXM")
    unpinned = plan("Qwen/Qwen2.5-7B", "2xA100", cpu_memory_gib=8)
    assert "these" not in unpinned.smallest_fit.message  # nothing pinned: the search starts above the plan's count


@pytest.mark.parametrize("checkpointing", ["auto", "off"])
def test_nothing_fits_names_only_remedies_not_yet_tried(checkpointing):
    """Qwen2.5-VL-7B with 64 images of 1,024 x 1,024 pixels a sample fits no count of H100s. The message used to
    say "enable checkpointing" when checkpointing had been tried (auto); it names it only when it was off, and
    the images, which are what make the sample large."""
    from advisor.planning.api import plan

    result = plan("Qwen/Qwen2.5-VL-7B-Instruct", "8xH100", image_size=1024, images_per_sample=64,
                  activation_checkpointing=checkpointing)
    text = " ".join(result.why)
    assert result.recommendation is None and "use fewer or smaller images" in text
    assert ("enable checkpointing" in text) == (checkpointing == "off")
    assert ("(with activation checkpointing)" in text) == (checkpointing != "off")


def test_pinned_mesh_degrees_that_do_not_fit_name_what_fits_and_what_it_drops(capsys):
    """Llama-3.1-70B on 2 nodes of 8 H200 with --pp 2 --tp 2: a pipeline stage under FSDP2 keeps its rank's
    weights unsharded in bf16 and their gradients accumulated unsharded in fp32 across the micro-batches
    (about 17.6B weights a rank: 70.6B / (pp 2 x tp 2), 6 bytes each, some 99 GiB), so no such mesh fits
    139.8 GiB, while zero3 alone fits these 16 GPUs (the unpinned plan recommends it), and so does the --tp 2 mesh
    without the pipeline. The plan said "Nothing fits. 24 x H200 would fit with zero3" (a search that started
    above the plan's own count) and "nothing fits with the hf loss; with --loss chunked, zero3 fits" (zero3 fit
    with the hf loss already)."""
    pinned = plan("meta-llama/Llama-3.1-70B", "8xH200", nodes=2, pp=2, tp=2)
    assert pinned.recommendation is None
    assert pinned.smallest_fit.message == ("zero3 fits on these 16 x H200 on mesh dp_shard 8 x tp 2 without --pp 2 "
                                           "at micro-batch 1.")
    assert not any("hf loss" in line for line in pinned.why)
    assert plan("meta-llama/Llama-3.1-70B", "8xH200", nodes=2).recommendation.strategy == "zero3"
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "-m", "meta-llama/Llama-3.1-70B", "-g", "2x8xH200", "--pp", "2", "--tp", "2"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 3 and out.startswith("No mesh with --tp 2 --pp 2 fits. zero3 fits on these 16 x H200")


def test_a_pinned_degree_keeps_its_mesh_in_the_smallest_fit():
    """Llama-3.1-8B on 8 H100 with --tp 2 at micro-batch 64 x 4,096 tokens: nothing fits, but the --tp 2 mesh
    dp_shard 4 x tp 2 does at micro-batch 1 (what --micro-batch 1 recommends), which the answer names rather
    than data parallelism without --tp 2. Qwen2.5-7B on 4 A10G with --tp 2: only zero3_offload fits these GPUs;
    the fewest that hold it without offload is 8 on the --tp 2 mesh dp_shard 4 x tp 2 (the plan on 8 x A10G
    --tp 2 recommends it), not 16 with zero3 alone."""
    micro = plan("meta-llama/Llama-3.1-8B", "8xH100", tp=2, micro_batch_size=64, seq_len=4096)
    assert micro.recommendation is None
    assert micro.smallest_fit.message == "zero3 fits on these 8 x H100-80GB-SXM on mesh dp_shard 4 x tp 2 at micro-batch 1."
    one = plan("meta-llama/Llama-3.1-8B", "8xH100", tp=2, micro_batch_size=1, seq_len=4096)
    assert one.recommendation.mesh.label == "dp_shard 4 x tp 2"
    offload = plan("Qwen/Qwen2.5-7B", "4xA10G", tp=2)
    assert offload.smallest_fit.message == ("zero3_offload fits on these 4 x A10G without --tp 2 at micro-batch 1. "
                                            "Without offload, 8 x A10G would fit with zero3 on mesh dp_shard 4 x tp 2 at micro-batch 1.")
    assert plan("Qwen/Qwen2.5-7B", "8xA10G", tp=2).recommendation.mesh.label == "dp_shard 4 x tp 2"


def test_the_smallest_fit_is_judged_at_the_asked_global_batch():
    """The torchtune recipe's Llama-3.1-70B on 8 x H100 with --tp 2 --global-batch 112 (a review's case): the pinned
    search finds no mesh (dp_shard 4 x tp 2 accumulates 28 micro-batches, and the recipe holds the gradients they
    add up), yet the smallest fit named that very mesh on these GPUs, judged at micro-batch 1 without accumulation.
    Each count it names now holds the 112 samples: the plan with --global-batch 112 on the GPUs it names, with the
    strategy and mesh it names, fits (on these 8 only by offloading, without --tp 2; on 16 with --tp 2 on the GPUs
    alone)."""
    job = dict(recipe="torchtune", global_batch_size=112)
    p = plan("meta-llama/Llama-3.1-70B", "8xH100", tp=2, **job)
    fit = p.smallest_fit
    assert p.recommendation is None and fit.strategy == "zero3_offload" and fit.num_gpus == 8
    assert fit.message == ("zero3_offload fits on these 8 x H100-80GB-SXM without --tp 2 at micro-batch 1. "
                           "Without offload, 16 x H100-80GB-SXM would fit with zero3 on mesh dp_shard 8 x tp 2 at micro-batch 1.")
    here = plan("meta-llama/Llama-3.1-70B", "8xH100", strategy="zero3_offload", micro_batch_size=1, **job)
    assert here.chosen.fits and here.chosen.gradient_accumulation_steps == 14
    more = plan("meta-llama/Llama-3.1-70B", "2x8xH100", tp=2, micro_batch_size=1, **job)
    assert more.chosen.mesh.label == "dp_shard 8 x tp 2" and more.chosen.fits and more.chosen.strategy == "zero3"
    assert more.chosen.gradient_accumulation_steps == 14


def test_the_smallest_fit_at_a_global_batch_names_the_micro_batch_it_fits_at():
    """Qwen2.5-32B at 8,192 tokens under the Trainer with --global-batch 24 and zero3 pinned on 4 x A100: nothing fits.
    Judged at micro-batch 1 with the rest accumulated (the Trainer's FSDP holds the unsharded gradients through it),
    zero3_offload needs more GPUs than it does at 3 samples a GPU at once; the answer is 8 GPUs at micro-batch 3, which
    the plan there confirms (and micro-batch 1 there does not fit)."""
    job = dict(seq_len=8192, recipe="trainer", global_batch_size=24)
    p = plan("Qwen/Qwen2.5-32B", "4xA100", strategy="zero3", **job)
    assert p.recommendation is None
    assert p.smallest_fit.message.startswith("8 x A100-80GB-SXM would fit with zero3_offload at micro-batch 3. ")
    there = plan("Qwen/Qwen2.5-32B", "8xA100", strategy="zero3_offload", micro_batch_size=3, **job).candidate(
        "zero3_offload")
    assert there.fits and there.gradient_accumulation_steps == 1
    one = plan("Qwen/Qwen2.5-32B", "8xA100", strategy="zero3_offload", micro_batch_size=1, **job).candidate(
        "zero3_offload")
    assert not one.fits


def test_no_count_with_pinned_degrees_says_the_pins_limited_the_search():
    """Llama-3.1-405B on A10Gs with --tp 2: no count of GPUs fits a mesh that keeps tp 2 (the blocks' inputs and
    a gathered block of 405B at 2,048 tokens outgrow 22 GiB even sharded), while the unpinned search finds 1,024 on
    dp_shard 128 x cp 2 x tp 4. The message blamed the sample alone; a review found pinned searches that miss counts
    (a --pp 5 no power of two divides), so it says which counts and meshes were tried, not why none fits."""
    pinned = plan("meta-llama/Llama-3.1-405B", "8xA10G", tp=2)
    assert pinned.smallest_fit.num_gpus is None
    assert pinned.smallest_fit.message.startswith("No count tried fits with --tp 2, with activation checkpointing "
                                                   "(every count within a node, then whole nodes doubling, on the "
                                                   "meshes that keep --tp 2")
    assert pinned.smallest_fit.message.endswith("shorten --seq-len or change or drop --tp 2.")
    free = plan("meta-llama/Llama-3.1-405B", "8xA10G")
    assert (free.smallest_fit.num_gpus, free.smallest_fit.mesh.label) == (1024, "dp_shard 128 x cp 2 x tp 4")


@pytest.mark.parametrize(("recipe", "said", "not_said"), [
    # torchtune builds the model under set_default_dtype(cfg.dtype): no PEFT, no fp32 adapters
    ("torchtune", "the whole model, adapters too, built in the precision's one dtype", "autocast_adapter_dtype"),
    # DeepSpeed casts the whole module; the adapters' fp32 copies are its optimizer's masters
    ("deepspeed", "cast to the compute dtype with the whole module", "autocast_adapter_dtype"),
    ("trainer", "adapters in fp32 (PEFT's autocast_adapter_dtype)", "one dtype"),
])
def test_the_recipe_note_says_how_that_stack_holds_a_lora_model(recipe, said, not_said):
    """The recipe line said every stack whose base rests in the compute dtype upcasts PEFT's adapters to fp32,
    torchtune's and DeepSpeed's too, which hold them in bf16 (the LoRA line beside it said so)."""
    p = plan("Qwen/Qwen2.5-7B", "2xA100", recipe=recipe, lora=16)
    note = next(line for line in p.assumptions if line.startswith(f"recipe {recipe} ("))
    assert said in note and not_said not in note


def test_no_mesh_fits_names_the_degrees_it_tried_and_the_short_why_gives_the_shortfall(capsys):
    """Qwen2.5-7B pinned to zero3 on 2 x A100: the meshes tried are cp 2 and pp 2, none with tp or HSDP, yet the line
    said 'tp, cp and HSDP degrees inside a node'; and the short output's only why was that line, not zero3's own
    79.6 of 79.2 GiB (a review's findings)."""
    p = plan("Qwen/Qwen2.5-7B", "2xA100", strategy="zero3")
    assert {c.mesh.label for c in p.candidates if c.mesh is not None} == {"cp 2", "pp 2 (1f1b)"}
    assert "No mesh fits either (tried 3: cp and pp degrees)." in p.why  # pp 2 twice (one schedule pruned)
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--strategy", "zero3"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 3
    assert "Why: zero3 does not fit: needs 79.6 GiB per GPU of 79.2 GiB even at micro-batch 1" in out
