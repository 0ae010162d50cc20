"""The stacks users run, measured on a real H100 (``benchmarks/gpu_stacks.py``, results in
``benchmarks/results/gpu_stacks.jsonl``): the plan of each job against what the GPU allocated.

Hugging Face Trainer on one GPU (fp32 or bf16-loaded weights, PEFT LoRA over a bf16 base, fused or foreach
AdamW) and ``wrap()`` leaving the model unchanged on one GPU: the estimate within 1% of the measured peak
allocated over steps 2-3 (the bar for allocated memory), and the plan ``AdvisorCallback`` made on the GPU
at the time within 1% as well, since that is the line the user reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_stacks_report  # noqa: E402

ROWS = [r for r in gpu_stacks_report.load() if r["kind"] in ("trainer", "wrap")]


def test_the_measured_set_is_there():
    kinds = [r["kind"] for r in ROWS]
    # two of the Trainer rows accumulate; seven are the 3-8B models measured 2026-11-27; the last, the README's LoRA
    # command (Qwen2.5-7B r16, micro-batch 1, 2,048 tokens, checkpointing), ran on an H200 on 2026-11-29
    assert kinds.count("trainer") == 19 and kinds.count("wrap") == 2
    devices = [r["env"]["device"] for r in ROWS]
    assert sum(d.startswith("NVIDIA H100") for d in devices) == 20 and devices[-1] == "NVIDIA H200"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['kind']}-{r.get('name', '')}-{r['model']}")
def test_one_gpu_stacks_are_planned_within_one_percent_of_the_h100(row):
    planned = gpu_stacks_report.estimate(row).peak_allocated
    assert abs(planned - row["allocated"]) / row["allocated"] < 0.01


def test_the_callback_line_on_the_gpu_was_within_one_percent():
    """What AdvisorCallback printed on the H100 itself, beside its own plan (wrappers.measured)."""
    for row in (r for r in ROWS if r["kind"] == "trainer"):
        assert abs(row["planned_allocated"] - row["allocated"]) / row["allocated"] < 0.01, row["product_line"]
        assert "(planned " in row["product_line"]


IMPL = [r for r in gpu_stacks_report.load() if r["kind"] == "impl" and r["strategy"] == "ddp" and r["model"] == "qwen0.5b"]


@pytest.mark.parametrize("row", IMPL, ids=lambda r: r["optimizer_impl"])
def test_ddp_by_adamw_implementation_within_one_percent_of_the_h100(row):
    """Qwen2.5-0.5B, DDP (rank 0 of 2), seq 256: fused AdamW leaves the end of backward as the peak (the tied
    embedding's gradients, every block's autocast copies freed), for-loop and foreach the optimizer step."""
    planned = gpu_stacks_report.estimate(row).peak_allocated
    assert abs(planned - row["allocated"]) / row["allocated"] < 0.01


@pytest.mark.parametrize("model", ["qwen0.5b", "llama1b"])
def test_lightning_holds_the_last_gradients_through_the_forward(model):
    """Lightning's closure runs training_step before zero_grad (recipe row ``zero_grad: before_backward``): the
    previous step's gradients live through the forward. Qwen2.5-0.5B, bf16-mixed, micro-batch 4, seq 1024 on the
    H100: 20.32 GiB where Trainer peaks at 19.61; the plan within 1% (it was 4.0% low before the fact was read).
    Its autocast runs with cache_enabled=False (``autocast_cache: false``): under checkpointing (Llama-3.2-1B,
    micro-batch 2, seq 2048) the blocks' bf16 weight copies are gone by the loss; 24.47 GiB on the H100, the
    plan 7.0% high while it counted every cached copy."""
    row = next(r for r in gpu_stacks_report.load() if r["kind"] == "lightning" and r["model"] == model)
    planned = gpu_stacks_report.estimate(row).peak_allocated
    assert abs(planned - row["allocated"]) / row["allocated"] < 0.01


def test_without_autocast_cache_the_end_of_forward_holds_only_the_saved_copies():
    """The same Lightning job on the CPU simulator (its order and its cache setting: advisor.simulate.step),
    26.22 GiB with the cache on and 24.41 GiB off; the estimate's end of forward drops by the blocks' bf16
    copies, 2 x (1,235,814,400 - 262,668,288 embedding - 2,048 final norm) = 1,946,288,128 B: the head is tied
    to the embedding, whose copy autograd saves either way."""
    from advisor.planning.api import plan
    from advisor.recipes import get_recipe
    from advisor.training import TrainingConfig

    def forward_end(recipe):
        training = TrainingConfig(recipe=recipe, micro_batch_size=2, seq_len=2048, activation_checkpointing="on")
        return plan("meta-llama/Llama-3.2-1B", "1xH100", strategy="ddp", training=training
                    ).candidate("ddp").memory_bytes.at_end_of_forward

    lightning = get_recipe("lightning")
    cached = lightning.model_copy(update={"autocast_cache": True})  # the same row with torch's default
    assert forward_end(cached) - forward_end(lightning) == 1_946_288_128


FRESH = [r for r in gpu_stacks_report.load() if r["kind"] in ("titan", "actoff")]


@pytest.mark.parametrize("row", [r for r in FRESH if r["model"] == "llama8b"],
                         ids=lambda r: f"{r['kind']}-{r['strategy']}-{r['seq_len']}-{r['checkpointing']}-{r.get('compile')}")
def test_torchtitan_units_and_activation_offload_within_half_a_percent_at_8b(row):
    """Llama-3.1-8B as rank 0 of a fake group of 8 on the H100: torchtitan's own FSDP2 units (eager and compiled) and
    --activation-offload's pinned-memory hooks; the plan of each within 0.5% of the peak allocated."""
    planned = gpu_stacks_report.estimate(row).peak_allocated
    assert abs(planned - row["allocated"]) / row["allocated"] < 0.005


@pytest.mark.parametrize("row", [r for r in FRESH if r["kind"] == "titan" and r["strategy"] == "zero3"
                                 and r["model"] == "llama8b" and not r["compile"]], ids=lambda r: str(r["seq_len"]))
def test_one_root_unit_was_over_what_torchtitan_allocates(row):
    """The same ZeRO-3 jobs planned with the torch recipe's layout (embedding, final norm and head in one root unit,
    as the torchtitan recipe was planned before its units were modelled): more than 3% over the H100."""
    from advisor.planning.api import plan

    options = {k: v for k, v in gpu_stacks_report.job(row).items() if v is not None}
    options.update(recipe="torch", optimizer_impl="fused")
    result = plan(gpu_stacks_report.accuracy.spec_for(gpu_stacks_report.accuracy.MODELS[row["model"]]),
                  options.pop("gpus"), **options)
    assert result.candidate("zero3").memory_bytes.peak_allocated > 1.03 * row["allocated"]


def test_under_a_cap_the_plans_total_is_not_below_what_ran():
    """The Trainer LoRA r16 job on Llama-3.1-8B (micro-batch 4, 4,096 tokens, checkpointing) on the H100 under a cap
    on the caching allocator (torch.cuda.set_per_process_memory_fraction, ``--only cap``): it trained at 47.5 and
    45.0 GiB, with one allocator retry each (the allocator freed its cached blocks and retried), and ran out of memory
    at 43.5 GiB; uncapped it reserved 49.39 GiB. What must fit (the plan's total less the context, 47.47 GiB) is above
    the cap where the run died, so the plan does not say it fits there (it is 2.5 GiB over the 45.0 that trained: the
    base gap is conservative near the card's limit). Counting the blocks cached around recomputation in what must fit
    (50.81 GiB) would also have refused the two caps that trained; in reserved they give what the uncapped run held,
    within 3%."""
    capped = {row["cap_gib"]: row for row in gpu_stacks_report.load(capped=True) if row["checkpointing"]}
    assert sorted(capped) == [43.5, 45.0, 47.5]
    assert capped[47.5]["oom"] is None and capped[45.0]["oom"] is None and capped[43.5]["oom"] is not None
    assert capped[45.0]["alloc_retries"] >= 1
    uncapped = next(r for r in ROWS if r["model"] == "llama8b" and r["micro_batch"] == 4 and r["checkpointing"])
    planned = gpu_stacks_report.estimate(uncapped)
    must_fit = planned.total - planned.outside_allocator
    assert must_fit / 2**30 > 43.5
    assert (must_fit + planned.recompute_cache) / 2**30 > 47.5
    assert planned.recompute_cache > 0 and abs(planned.reserved - uncapped["reserved"]) / uncapped["reserved"] < 0.03


def test_without_checkpointing_the_cap_that_failed_is_below_what_must_fit():
    """The same model without checkpointing (micro-batch 1, 4,096 tokens; uncapped 40.01 GiB allocated, 41.28
    reserved): it trained capped at 42.0 GiB with no allocator retry and ran out of memory at 41.0 and 40.5, allocating
    the 1.96 GiB fp32 logits with 2.00 GiB reserved but not allocated, in blocks the allocator could not free. The
    plan's total less the context (44.35 GiB) is above both caps that failed; this plan carries no recompute cache."""
    capped = {row["cap_gib"]: row for row in gpu_stacks_report.load(capped=True)
              if row["kind"] == "trainer-cap" and not row["checkpointing"]}
    assert sorted(capped) == [40.5, 41.0, 42.0]
    assert capped[42.0]["oom"] is None and capped[41.0]["oom"] is not None and capped[40.5]["oom"] is not None
    uncapped = next(r for r in ROWS if r["model"] == "llama8b" and r["micro_batch"] == 1 and r["seq_len"] == 4096)
    planned = gpu_stacks_report.estimate(uncapped)
    assert planned.recompute_cache == 0 and (planned.total - planned.outside_allocator) / 2**30 > 41.0


# FSDP1 as HF Trainer runs a LoRA (benchmarks/results/gpu_fsdp1.jsonl, 2026-11-27): Mistral-7B, pure bf16, rank 0 of a
# fake group of 2 on the H100, with the image's libraries (transformers 5.17) and with fms-acceleration's (4.48.1)
FSDP1 = gpu_stacks_report.fsdp1_rows()
ONE_BLOCK_INPUT = 4 * 4096 * 4096 * 2  # micro-batch 4 x 4,096 tokens x hidden 4,096, bf16: 134,217,728 B


@pytest.mark.parametrize("pair", [p for p in FSDP1 if p[0]["env"]["transformers"] != "4.48.1"],
                         ids=lambda p: f"{p[0]['kind']}-mb{p[0]['micro_batch']}-{p[0]['checkpoint_impl']}-{p[0]['adapters']}")
def test_fsdp1_lora_through_the_trainer_within_one_percent_of_the_h100(pair):
    row, planned = pair
    assert abs(planned - row["allocated"]) / row["allocated"] < 0.01


def test_the_trainer_and_the_hand_wrapped_fsdp1_allocate_alike():
    """The hand-built FSDP1 (gpu_stacks.fsdp1_case) is the Trainer's: same peak to 0.01% in both releases."""
    by = {(r["kind"], r["micro_batch"], r["env"]["transformers"], r["checkpoint_impl"], r["adapters"]): r["allocated"]
          for r, _ in FSDP1}
    for release, mb in (("5.17.0", 2), ("4.48.1", 4)):
        hand, trainer = (by[(kind, mb, release, "reentrant", "float32")] for kind in ("fsdp1", "trainer-fsdp1"))
        assert abs(hand - trainer) / trainer < 1e-4


def test_transformers_4_48_holds_every_blocks_input_and_its_gradient_through_backward():
    """The operator logs of the micro-batch 4 step: as each block's recompute starts in backward, 4.48.1 holds one
    block input more than at the block before (its input kept and its gradient added), 5.17 one less (its input
    freed); and the 4.48.1 rows are within 2% of the estimate only with the publisher code that says so (-1.4% with
    it; 10-12% above the estimate without)."""
    steps = {}
    for path in gpu_stacks_report.RESULTS.glob("gpu_fsdp1_trace_*.json.gz"):
        levels = gpu_stacks_report.recompute_levels(path)
        assert len(levels) == 32
        steps[path.name] = sorted(b - a for a, b in zip(levels, levels[1:]))[15]
    assert abs(steps["gpu_fsdp1_trace_transformers4.48.1.json.gz"] - ONE_BLOCK_INPUT) < 0.02 * ONE_BLOCK_INPUT
    assert abs(steps["gpu_fsdp1_trace_transformers5.17.json.gz"] + ONE_BLOCK_INPUT) < 0.02 * ONE_BLOCK_INPUT
    old = [(r, planned) for r, planned in FSDP1 if r["env"]["transformers"] == "4.48.1"]
    assert len(old) == 3
    for row, planned in old:
        assert abs(planned - row["allocated"]) / row["allocated"] < 0.02
        bare = gpu_stacks_report.published_memory_estimate({**gpu_stacks_report.fsdp1_case(row), "publisher_code": []})
        assert (row["allocated"] - bare) / row["allocated"] > 0.08


def test_the_top_blocks_backward_holds_the_fp32_adapters_copies():
    """The block moment of the micro-batch 4 FSDP1 job (transformers 5.17, pure bf16, PEFT's fp32 adapters with
    dropout 0.1 on q, k, v, o) against the most the H100 allocated while the top block was recomputed and its
    backward ran: -2.2%; -5.4% while the plan held the adapters in bf16 (each recomputed adapter's dropout output
    is float32[4, 4096, 4096] in the operator log, 0.125 GiB more than bf16)."""
    row, _ = next(p for p in FSDP1 if p[0]["micro_batch"] == 4 and p[0]["env"]["transformers"] == "5.17.0")
    measured = gpu_stacks_report.first_block_backward_peak(
        gpu_stacks_report.RESULTS / "gpu_fsdp1_trace_transformers5.17.json.gz")
    planned = gpu_stacks_report.estimate_fsdp1_moments(row)["block_backward"]
    assert abs(planned - measured) / measured < 0.03


BERT = [r for r in gpu_stacks_report.load() if r["kind"] == "bert"]


@pytest.mark.parametrize("row", BERT, ids=lambda r: r["name"])
def test_bert_on_the_h200(row):
    """BERT-large sequence classification under the Trainer on an H200 (2026-11-29): 18 full fine-tunes as
    transformers' single-GPU docs ran them and around them, and two LoRA r16 over the fp32 base, within 3% of the
    allocated peak (measured -2.8% to +0.7%; fp32 within 2%). Three findings moved the estimate: Adafactor's step
    holds one tensor's temporaries (its fp16 checkpointed row read +16.9% while they were every parameter's); under
    autocast the query, key and value each save their own cast of the block's input, and a CUDA SDPA's output is the
    tensor the output projection saves (fp16 / bf16 rows -2.9% to -4.5%, the fp32 SDPA row +1.8%, before); a frozen
    BERT block saves no input of a frozen linear (the LoRA rows +12.0% and +27.6% with the base counted in fp32, as
    loaded, and the blocks as a full fine-tune's)."""
    planned = gpu_stacks_report.estimate(row).peak_allocated
    within = 0.02 if row["precision"] == "fp32" else 0.03
    assert len(BERT) == 20
    assert abs(planned - row["allocated"]) / row["allocated"] < within


def test_the_readme_remedy_on_the_h200():
    """The README's first command's remedy, ``--optimizer-impl fused`` (zero3 over 2 ranks, micro-batch 1, 2,048
    tokens, Qwen2.5-7B), rank 0 of a fake group: 61.98 GiB allocated, the plan within 1%. It reserved 82.89 GiB
    from an empty cache, more than an A100-80GB holds: what must fit is the allocated peak, since the allocator
    frees its cache before it fails an allocation: capped at 77.85 GiB (an A100's less 1.3 GiB outside the allocator),
    68.5 and 64.0 GiB it trained, with 3, 9 and 15 allocator retries."""
    row = next(r for r in gpu_stacks_report.load() if r["kind"] == "headline")
    planned = gpu_stacks_report.estimate(row)
    assert abs(planned.peak_allocated - row["allocated"]) / row["allocated"] < 0.01
    assert row["reserved"] > 79.15 * 2**30 > planned.total
    capped = {r["cap_gib"]: r for r in gpu_stacks_report.load(capped=True) if r["kind"] == "headline"}
    assert sorted(capped) == [64.0, 68.5, 77.85] and all(r["oom"] is None for r in capped.values())
    assert (planned.total - planned.outside_allocator) / 2**30 > 68.5  # what must fit is above a cap that trained
