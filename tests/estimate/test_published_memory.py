"""The estimate against published real-GPU peaks (profiles/published_memory.json): every case is
cited and says what its figure measured, and the expressible cases stay within the error measured by
benchmarks/published_memory.py (benchmarks/results/published_memory.md)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from profiles import PROFILES_DIR

RECIPES = {r["name"] for r in json.loads((PROFILES_DIR / "recipes.json").read_text())["recipes"]}

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import publisher_code  # noqa: E402
from published_memory import estimate, plan_of, published_bytes  # noqa: E402

DATA = json.loads((PROFILES_DIR / "published_memory.json").read_text())
CASES = DATA["cases"]
KINDS = {"allocated", "reserved", "active", "nvidia-smi", "unspecified", "trained", "oom"}
# Cases with a measured figure (trained / oom rows say only whether the run fitted).
# Sources added after these error bounds were measured; their errors are reported, not bounded here
# (litgpt's 2023 resource tables: the FSDP LoRA and the QLoRA rows bounded by their own tests below;
# benchmarks/results/published_memory.md).
LATER = ("litgpt-rt-", "hfblog-", "alignment-", "llamafactory-", "peft-fsdp-", "lfissue", "litgptissue", "alpaca",
         # torchtune's 'Memory and training speed' rows, re-read at the table's commit (test below)
         "torchtune-8b-lora-a6000", "torchtune-8b-full-a6000", "torchtune-70b-lora-",
         # Hugging Face's single-GPU docs (BERT on a V100, 2022): -17%..+27% on nvidia-smi, the allocator's gap
         # (benchmarks/results/published_memory.md)
         "hfdocs-")
EXPRESSIBLE = [c for c in CASES if not c["not_expressible"] and c["kind"] not in ("trained", "oom")]


def _error(case: dict) -> float:
    """Relative error of the estimate against the published figure: peak + the calibrated allocator gap
    for a reserved (or unspecified) figure, that + the CUDA context for nvidia-smi, the peak allocated
    for allocated or active (as the benchmark compares them)."""
    return estimate(case).compared(case["kind"])[1] / published_bytes(case) - 1


def test_every_case_names_a_source_and_a_memory_kind():
    assert len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert case["source"]["title"].strip() and case["source"]["url"].startswith("https://"), case["id"]
        assert case["kind"] in KINDS, case["id"]
        assert case["unit"] in ("GiB", "GB", "MiB", "B") and case["figure"] > 0, case["id"]
        assert isinstance(case["not_expressible"], list) and isinstance(case.get("approximated", []), list)
        assert case["stack"] in RECIPES and case["versions"].strip(), case["id"]
    for row in DATA.get("excluded", []):
        assert row["url"].startswith("https://") and row["reason"].strip()


def test_enough_expressible_cases_with_their_memory_kind():
    """The must-show: at least 15 published cases, 10 of them with every setting expressible and 5 of
    those reporting max_memory_reserved."""
    assert len(CASES) >= 15
    assert len(EXPRESSIBLE) >= 10
    assert sum(c["kind"] == "reserved" for c in EXPRESSIBLE) >= 5


def test_expressible_full_and_lora_runs_within_the_published_error():
    """Published torchtitan (reserved), Answer.AI LoRA (reserved and allocated), litgpt LoRA (allocated),
    torchtune full (active) and PEFT DeepSpeed LoRA (nvidia-smi) runs, none of them tuned on: measured
    median |error| 2.0% over 45 cases, every case within -14.8%..+10.8% (with publisher_code: litgpt's tied
    models with the head its conversion unties, Answer.AI's fp32 logits held through the step)
    (the low end: Answer.AI's CPU-offload batch-10 run, reserved near the 24 GB card's capacity; the high end:
    Answer.AI's FSDP LoRA at 2,048 tokens, batch 1, reserved with the allocator's cache under checkpointing,
    profiles/allocator_overhead.json checkpointing_fragmentation; -20.3%..+6.8% without that term)."""
    errors = [_error(c) for c in EXPRESSIBLE if not c.get("quantize") and not c["id"].startswith(LATER)]
    assert len(errors) >= 15
    assert all(-0.16 <= e <= 0.11 for e in errors), errors
    assert statistics.median(abs(e) for e in errors) <= 0.05


def test_litgpt_qlora_runs_within_ten_percent_with_what_their_code_held():
    """litgpt's QLoRA peaks (allocated) were 25-31% above our estimate of today's recipe; with what
    litgpt 2024 held (publisher_code: bitsandbytes 0.42 MatMul4Bit inputs kept until the graph dies,
    Lightning's 4-bit head dequantised as fp16 + bf16 copies, the untied head) they are measured at
    -6.4% to +8.6% (benchmarks/results/published_memory.md). Without those settings every one stays
    more than 20% below: the mechanisms, not a constant, close the gap."""
    cases = [c for c in EXPRESSIBLE if c.get("quantize") and c["id"].startswith("litgpt") and not c["id"].startswith(LATER)]
    assert len(cases) >= 5 and all(c.get("publisher_code") for c in cases)
    with_code = [_error(c) for c in cases]
    without = [_error({k: v for k, v in c.items() if k != "publisher_code"}) for c in cases]
    assert all(-0.10 <= e <= 0.10 for e in with_code), with_code
    assert all(e < -0.20 for e in without), without


def test_torchtune_a6000_rows_read_at_the_tables_commit():
    """torchtune's README table (added at 30b8519e, 2024-09-24) lists Llama 3.1 8B LoRA and full fine-tunes at
    30.3 and 37.4 GiB on an A6000, beside 16.2 and 18.9 GiB for the same recipes on a 4090. Read with the configs
    of that commit (LoRA on q_proj and v_proj only; PagedAdamW8bit with optimizer_in_bwd; CEWithChunkedOutputLoss
    compiled, the torchtune recipe) and without activation checkpointing on the 48 GB card, each figure lies between
    the estimated peak allocated and reserved, within 7% of both (measured: allocated -5.6% / -4.3%, reserved +5.0%
    / +6.4%); with checkpointing on, as the configs default, both fall more than 30% short. The figure's kind is not
    stated, so the benchmark compares it with reserved; this test checks the reading."""
    for case_id in ("torchtune-8b-lora-a6000", "torchtune-8b-full-a6000"):
        case = _case(case_id)
        assert case["activation_checkpointing"] == "off" and not case["not_expressible"]
        figures = estimate(case)
        allocated = figures.allocated / published_bytes(case) - 1
        reserved = figures.reserved / published_bytes(case) - 1
        assert -0.07 <= allocated < 0 < reserved <= 0.07, (case_id, allocated, reserved)
        with_ac = estimate({**case, "activation_checkpointing": "on"}).allocated / published_bytes(case) - 1
        assert with_ac < -0.30, (case_id, with_ac)


def test_publisher_code_names_are_documented_with_sources():
    doc = DATA["publisher_code"]
    for case in CASES:
        for name in case.get("publisher_code", []):
            assert name in publisher_code.KNOWN and name in doc, (case["id"], name)
    for entry in doc.values():
        assert entry["what"].strip() and entry["sources"]
        assert all(src.startswith("https://github.com/") for src in entry["sources"])


def _case(case_id: str) -> dict:
    return next(c for c in CASES if c["id"] == case_id)


def test_litgpt_llama3_8b_qlora_mechanisms_worked_by_hand():
    """Llama 3 8B, micro-batch 2 x 512 tokens, nf4 without double quantisation, bf16:
    head 128256 x 4096 = 525,336,576 weights; 4-bit at rest 0.5 + 4/64 bytes a weight instead of
    2 bytes; dequantised as fp16 + bf16 (4 bytes a weight); the largest block linear (4096 x 14336)
    gets an fp16 copy beside the bf16 one the estimate counts; kept inputs
    2 bytes x 1024 tokens x 32 x (4096 + 4096 + 4096 + 14336) (ln_f's output in, the first block's
    norm_1 output out: it needs no gradient, so MatMul4Bit keeps no input there)."""
    case = _case("litgpt-llama3-8b-qlora")
    plan = plan_of(case)
    head = 128256 * 4096
    rest, head_dq, block_dq, kept = publisher_code.parts(case, plan.model, plan.training)
    assert rest == head // 2 + 4 * head // 64 - 2 * head == -755_171_328
    assert head_dq == 4 * head == 2_101_346_304
    assert block_dq == 2 * 4096 * 14336
    assert kept == 2 * 1024 * 32 * 26624 == 1_744_830_464
    extra = publisher_code.extra_bytes(case, plan.model, plan.training)
    assert extra["end_of_forward"] == rest + 2 * kept + head_dq
    assert extra["loss_backward"] == rest + kept + head_dq
    assert extra["optimizer_step"] == rest + kept


def test_litgpt_2023_qlora_mechanisms_worked_by_hand():
    """litgpt's 2023 resource table, Llama-2-7B bnb.nf4, micro-batch 1 x 1304 tokens (lit-gpt 8641822, Lightning
    71aed751, bitsandbytes 0.41.1): the untied head 32000 x 4096 = 131,072,000 weights packed at 0.5 + 4/64 bytes
    a weight instead of 2; dequantised as fp16 + bf16 (4 bytes a weight); the largest block linear (4096 x 11008)
    gets an fp16 copy; kept inputs 2 bytes x 1304 tokens x 32 x (4096 + 4096 + 4096 + 11008), one iteration's
    only (litgpt_longest_first: the longest batch is iteration 0's), so the end of forward holds no more of them
    than the start of backward."""
    case = _case("litgpt-rt-llama2-7b-qlora-nf4")
    plan = plan_of(case)
    head = 32000 * 4096
    rest, head_dq, block_dq, kept = publisher_code.parts(case, plan.model, plan.training)
    assert rest == head // 2 + 4 * head // 64 - 2 * head == -188_416_000
    assert head_dq == 4 * head == 524_288_000
    assert block_dq == 2 * 4096 * 11008 == 90_177_536
    assert kept == 2 * 1304 * 32 * 23296 == 1_944_190_976
    extra = publisher_code.extra_bytes(case, plan.model, plan.training)
    assert extra["end_of_forward"] == extra["loss_backward"] == rest + kept + head_dq == 2_280_062_976
    assert extra["block_backward"] == rest + kept + block_dq
    with pytest.raises(ValueError, match="bnb_ctx_keeps_input"):
        publisher_code.parts({**case, "publisher_code": ["lightning_bnb_every_linear", "litgpt_longest_first"]},
                             plan.model, plan.training)


def test_litgpt_2023_qlora_rows_within_five_percent_with_what_their_code_held():
    """litgpt's 2023 QLoRA rows (14.14 / 13.84 GB allocated) were 20.5% / 21.0% above the estimate; with what
    lit-gpt 8641822, Lightning 71aed751 and bitsandbytes 0.41.1 held (publisher_code) they are measured at
    -4.4% / -4.5%, as the same table's LoRA row (-3.5%) is without any. Without them both stay 20% below."""
    cases = [c for c in CASES if c["id"].startswith("litgpt-rt-llama2-7b-qlora")]
    assert len(cases) == 2
    with_code = [_error(c) for c in cases]
    without = [_error({k: v for k, v in c.items() if k != "publisher_code"}) for c in cases]
    assert all(-0.05 <= e <= 0.0 for e in with_code), with_code
    assert all(e < -0.20 for e in without), without


def test_answerai_fp32_logits_held_worked_by_hand():
    """Answer.AI's CPU-offload LoRA run, Llama-2-7B, 10 x 2048 tokens: transformers < 4.46 returns an fp32 copy of
    10 x 2048 x 32000 = 655,360,000 logits and train.py keeps it until after the step, 4 bytes each from the loss's
    backward on; the forward's loss holds it, its shifted copy and the log-softmax (12 bytes) where the estimate
    counts 10."""
    case = _case("answerai-7b-lora-fsdp-offload-bs10")
    plan = plan_of(case)
    logits = 10 * 2048 * 32000
    assert 4 * logits == 2_621_440_000
    assert publisher_code.fp32_logits_held_bytes(case, plan.model) == {
        "end_of_forward": 2 * logits, "loss_backward": 4 * logits, "block_backward": 4 * logits,
        "optimizer_step": 4 * logits}
    extra = publisher_code.extra_bytes(case, plan.model, plan.training)
    assert extra["loss_backward"] == extra["optimizer_step"] == 2_621_440_000
    with pytest.raises(ValueError, match="hf loss"):
        publisher_code.fp32_logits_held_bytes({**case, "loss": "chunked"}, plan.model)


def test_litgpt_untied_head_adds_a_bf16_head_to_a_tied_model():
    """Llama 3.2 1B ties its head; litgpt's conversion copies it: 2 x 128256 x 2048 bytes at every moment."""
    case = _case("litgpt-llama32-1b-lora")
    plan = plan_of(case)
    extra = publisher_code.extra_bytes(case, plan.model, plan.training)
    assert set(extra.values()) == {2 * 128256 * 2048}


def test_publisher_code_refuses_what_it_does_not_model():
    case = _case("litgpt-llama3-8b-qlora")
    plan = plan_of(case)
    with pytest.raises(ValueError, match="unknown"):
        publisher_code.parts({**case, "publisher_code": ["no_such_thing"]}, plan.model, plan.training)
    with pytest.raises(ValueError, match="checkpointing"):
        publisher_code.parts({**case, "activation_checkpointing": "on"}, plan.model, plan.training)


def test_litgpt_fsdp1_no_sync_worked_by_hand():
    """Llama-2-7B LoRA r8 on q,v, bf16-true, 2 ranks (lightning_fsdp1_no_sync): one Block's FlatParameter is
    4096 + 4096 (norms) + 4096 x 12288 (qkv) + 16 x 4096 + 8192 x 8 (LoRA A, B) + 4096 x 4096 (proj) + 3 x 4096 x
    11008 (MLP) = 202,514,432 parameters; no_sync holds all 32 Blocks' unsharded bf16 gradients, 2 bytes each. The
    estimate's own gradient shards (4,194,304 x 2 / 2 bytes) are what the step holds instead of the sharded flat
    gradients (32 x 202,514,432 x 2 / 2 bytes). At micro-batch 4 the recomputed block (more than the 2 x 405 MB of
    views' gradients and their concatenation) is the larger, so the MLP's moment wins: the frozen down projection's
    weight gradient, 11008 x 4096 x 2 bytes."""
    unit = 2 * (2 * 4096 + 4096 * 12288 + 16 * 4096 + 8192 * 8 + 4096 * 4096 + 3 * 4096 * 11008)
    assert unit == 2 * 202_514_432
    held, shards = 32 * unit, 4_194_304 * 2 // 2
    case = _case("litgpt-rt-llama2-7b-lora-fsdp2-mb4")
    plan = plan_of(case)
    extra = publisher_code.fsdp1_no_sync_bytes(case, plan.model, plan.training)
    assert extra["loss_backward"] == extra["end_of_forward"] == held == 12_960_923_648
    assert extra["block_backward"] == held + 11008 * 4096 * 2
    assert extra["end_of_backward"] == held - shards
    assert extra["optimizer_step"] == 32 * unit // 2 - shards == 6_476_267_520
    with pytest.raises(ValueError, match="zero3"):
        publisher_code.fsdp1_no_sync_bytes({**case, "strategy": "zero2"}, plan.model, plan.training)


def test_litgpt_fsdp_lora_rows_within_five_percent_with_fsdp1_no_sync():
    """litgpt's 2 x A100 FSDP LoRA rows (22.18 / 22.47 / 23.39 GB allocated) were 52-61% above the FSDP2 estimate;
    with FSDP1's no_sync unsharded flat gradients (publisher_code) they are measured at +0.2%, +0.5%, +3.0%
    (modelled with every micro-step at the longest sample: an upper bound). Without it every one stays more than
    half below."""
    cases = [c for c in CASES if c["id"].startswith("litgpt-rt-llama2-7b-lora-fsdp2-")]
    assert len(cases) == 3 and all(c["publisher_code"] == ["lightning_fsdp1_no_sync"] for c in cases)
    with_code = [_error(c) for c in cases]
    without = [_error({k: v for k, v in c.items() if k != "publisher_code"}) for c in cases]
    assert all(-0.01 <= e <= 0.05 for e in with_code), with_code
    assert all(e < -0.5 for e in without), without


def test_boundary_rows_are_judged_against_the_gpu_they_ran_on():
    """A trained / OOM row's figure is the GPU's memory and its estimate the plan's total: GPT-2 XL fp32
    DDP on a 24 GB card holds 16 bytes a parameter for weights, gradients and AdamW's two moments
    (1,557,611,200 x 16 = 23.2 GiB) before any activation, so it must be judged not to fit (the post's OOM)."""
    case = _case("hfblog-fsdp-gpt2xl-ddp-1gpu-oom")
    label, total, _, _ = estimate(case).compared(case["kind"])
    assert label == "total" and published_bytes(case) == int(23.65 * 2**30)
    assert total > 1_557_611_200 * 16 > published_bytes(case) * 0.98


def test_deepspeed_zero2_oom_request_is_the_flat_fp32_partition():
    """LLaMA-Factory #1221 (ZeRO-2, 8 GPUs) failed asking for 3.14 GiB inside torch's AdamW
    (exp_avg_sq.sqrt()): DeepSpeed's stage_1_and_2.py hands the optimizer one flat fp32 partition, so
    a single-tensor temporary is 4 bytes x 6,738,415,616 / 8 = 3,369,207,808 B = 3.14 GiB, the message's
    request, where the estimate counts the largest parameter / 8 (the DeepSpeed lines of
    benchmarks/results/published_memory.md)."""
    case = _case("lfissue1221-llama7b-zero2-8xv100-oom")
    plan = plan_of(case)
    assert plan.model.total_params == 6_738_415_616
    partition = 4 * plan.model.total_params // 8
    assert round(partition / 2**30, 2) == 3.14


def test_fms_full_fine_tunes_peak_at_the_foreach_step():
    """fms-acceleration's Mistral-7B full fine-tunes (FSDP1 on 2 A100s, pure bf16, transformers 4.48.1's default
    adamw_torch): the Trainer's peak allocated is 36,225,939,968 B at batch 2 and 36,226,136,576 at batch 4, the same
    at both, because it is the optimizer step: the states at rest (7,241,732,096 parameters x (2 + 2 + 2 + 2) / 2
    ranks = 28,966,928,384 B; the row's own allocated-after-training figure is 28,984,199,680) plus foreach AdamW's
    one state-sized temporary (x 2 / 2 = 7,241,732,096). The estimate's peak is that moment, within 0.5%."""
    for case_id in ("fms-mistral7b-full-fsdp-2xa100-mbs2-alloc", "fms-mistral7b-full-fsdp-2xa100-mbs4-alloc"):
        case = _case(case_id)
        moments = plan_of(case).candidate("zero3").memory_bytes
        assert moments.peak_moment == "optimizer_step", (case_id, moments.peak_moment)
        assert abs(estimate(case).allocated / published_bytes(case) - 1) <= 0.005


def test_shift_copy_by_hand():
    """hf_shift_logits_copy: transformers 4.48's ForCausalLMLoss slices the fp32 logits into a second copy, 4 bytes
    a logit of all positions but each sample's last: Mistral-7B (vocabulary 32,000) at 4 x 4096 tokens,
    4 x 4 x 4095 x 32,000 = 2,096,640,000 B, at the end of forward only."""
    case = _case("fms-mistral7b-lora-1xa100-mbs4-alloc")
    spec = plan_of(case).model
    assert publisher_code.shift_copy_bytes(case, spec) == 2_096_640_000
    extra = publisher_code.extra_bytes(case, spec, plan_of(case).training)
    assert extra["end_of_forward"] == 2_096_640_000 and extra["loss_backward"] == 0


def test_llamafactory_qlora_residual_in_bf16_by_hand():
    """LLaMA-Factory v0.6.2 never calls prepare_model_for_kbit_training (profiles/published_memory.json, the rows'
    last assumption): its Llama-2-7B QLoRA keeps the residual stream in bf16 where the trainer recipe's TRL path
    holds it in fp32 (``Recipe.kbit_upcast``). At 16,384 tokens that is 2 bytes less for each of the 32 blocks'
    saved 4,096-wide inputs and for the RoPE cos/sin pair (2 x 128 wide): 4,294,967,296 + 8,388,608 bytes."""
    case = next(c for c in CASES if c["id"] == "llamafactory-7b-qlora-fa2-s16384")
    assert case["kbit_upcast"] is False
    bf16 = plan_of(case).candidate("ddp").memory_bytes
    fp32 = plan_of({k: v for k, v in case.items() if k != "kbit_upcast"}).candidate("ddp").memory_bytes
    # at the loss's backward, where the blocks' saved inputs are all there is of them (the fp32 path's own peak is
    # now its recomputed block's backward, whose gated-MLP tensors are fp32 too: Dtypes.mlp)
    assert fp32.at_loss_backward - bf16.at_loss_backward == 32 * 16384 * 4096 * 2 + 16384 * 2 * 128 * 2
    # Against the published figures (unspecified, compared with reserved): each of the six FlashAttention-2 rows
    # now lies within 13% below the estimate's reserved, where the fp32 residual read -1.3% to +19.8%.
    for row in (c for c in CASES if c["id"].startswith("llamafactory-7b-qlora-fa2") and c["kind"] == "unspecified"):
        _, value, _, _ = estimate(row).compared(row["kind"])
        assert -0.13 <= value / published_bytes(row) - 1 <= 0, row["id"]
