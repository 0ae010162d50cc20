"""--seq-len max: for each strategy a length that fits at micro-batch 1 while 10% more does not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rich.console import Console

import advisor
from advisor.model.lora import LoraConfig
from advisor.planning.candidates import evaluate_candidate
from advisor.planning.longest import longest_key
from advisor.planning.render import headline_reason
from advisor.strategies import STRATEGIES, get_strategy


def test_each_length_fits_and_ten_percent_more_does_not():
    plan = advisor.plan("Qwen/Qwen2.5-7B", "8xH100", seq_len="max")
    found = {name: length for name, length in plan.longest_seq_len.items() if length and name in STRATEGIES}
    assert {"zero2", "zero3", "zero3_offload"} <= set(found)
    for name, length in found.items():
        for tokens, fits in ((length, True), (int(length * 1.1), False)):
            at = plan.training.model_copy(update={"seq_len": tokens, "micro_batch_size": 1})
            assert evaluate_candidate(plan.model, plan.hardware, at, name).fits is fits, (name, tokens)
    # The plan is shown at the longest of them on the GPUs alone (meshes included), one sample per GPU.
    assert plan.training.seq_len == max(v for k, v in plan.longest_seq_len.items() if v and "offload" not in k)
    assert plan.training.micro_batch_size == 1


def test_shown_at_the_longest_on_the_gpus_alone():
    """Llama-3.1-8B QLoRA (rank 32, every linear) on one A100 80GB under the trainer recipe: CPU offload holds a
    longer sequence than any GPU-only strategy, yet the plan is shown at the longest GPU-only length and
    recommends a GPU-only strategy (it was shown at the offloading length and recommended zero3_offload, so no
    GPU-only strategy fitted there). The reason gives the offloading length and that candidate's own figures."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "1xA100", seq_len="max", recipe="trainer",
                        lora=LoraConfig(rank=32, targets="all-linear"), quantize="nf4", micro_batch_size=1, activation_checkpointing="on")
    longest = plan.longest_seq_len
    gpu_only = max(v for k, v in longest.items() if v and not get_strategy(k).on("torch").offloads)
    offloaded = max(v for k, v in longest.items() if v and get_strategy(k).on("torch").offloads)
    assert offloaded > gpu_only == plan.training.seq_len
    assert not get_strategy(plan.recommendation.strategy).on("torch").offloads
    (reason,) = [x for x in plan.reasons if x.kind == "longer-with-offload"]
    assert (reason.seq_len, reason.gpu_only_seq_len) == (offloaded, gpu_only)
    at = plan.training.model_copy(update={"seq_len": offloaded})
    there = evaluate_candidate(plan.model, plan.hardware, at, reason.strategy)
    assert there.fits and (reason.step_s, reason.tokens_per_s) == (there.step_time.step_s, there.step_time.tokens_per_s)


def test_offload_is_planned_when_nothing_else_holds_a_token():
    """Llama-3.1-8B full fine-tune on one 24 GB 4090: its weights, gradients and AdamW states (16 bytes a
    parameter, 121 GiB) exceed the card whatever the length, so only offload holds a sequence: the plan is
    shown there and no reason compares it with a GPU-only length."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "1xRTX4090", seq_len="max")
    longest = plan.longest_seq_len
    assert not any(v for k, v in longest.items() if not get_strategy(k).on("torch").offloads)
    assert plan.training.seq_len == max(v for v in longest.values() if v)
    assert not [x for x in plan.reasons if x.kind == "longer-with-offload"]


def test_meshes_are_searched_too():
    """Llama-3.1-8B on 8 x H100: the longest data-parallel length is zero3_offload's, 39,710 tokens; context
    parallelism over the 8 GPUs holds 265,616 (the search ignored meshes before: 39,710 was the answer).
    Each mesh's length fits on that mesh at micro-batch 1 and 10% more (in whole 2 x cp chunks) does not."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len="max")
    longest = plan.longest_seq_len
    assert longest["zero3_offload"] == max(v for k, v in longest.items() if k in STRATEGIES and v) == 39_710
    assert plan.training.seq_len == longest["zero3 cp 8"] == 265_616
    assert plan.recommendation is not None and plan.recommendation.mesh.cp == 8
    meshes = {f"{c.strategy} {c.mesh.label}": c.mesh for c in plan.candidates if c.mesh is not None}
    assert set(meshes) == {k for k in longest if k not in STRATEGIES}
    for key, mesh in meshes.items():
        step = 2 * mesh.cp
        for tokens, fits in ((longest[key], True), (int(longest[key] * 1.1) // step * step, False)):
            at = plan.training.model_copy(update={"seq_len": tokens, "micro_batch_size": 1})
            assert evaluate_candidate(plan.model, plan.hardware, at, "zero3", mesh).fits is fits, (key, tokens)


def test_pinned_pipeline_degrees_search_their_own_meshes():
    """--pp 2 with --seq-len max on Llama-3.1-8B, 8 x H100: the plan must be a pp 2 mesh, so its length is the longest
    one of those holds. It took the length of context parallelism over the 8 GPUs without the pipeline (cp 8:
    265,616), where no pp 2 mesh fits, and said 'No mesh with --pp 2 fits'. Now it is planned on a pp 2 mesh at the
    length that mesh holds, and each pp 2 mesh's length fits on it and 10% more does not."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len="max", pp=2)
    longest = plan.longest_seq_len
    pipelined = {longest_key(c.strategy, c.mesh): c.mesh for c in plan.candidates if c.mesh is not None}
    assert pipelined and all(mesh.pp == 2 for mesh in pipelined.values())
    assert plan.recommendation is not None and plan.recommendation.mesh.pp == 2
    assert plan.training.seq_len == max(longest[key] for key in pipelined if longest[key]) < 265_616
    for key, mesh in pipelined.items():
        if not longest[key]:
            continue
        for tokens, fits in ((longest[key], True), (int(longest[key] * 1.1), False)):
            at = plan.training.model_copy(update={"seq_len": tokens, "micro_batch_size": 1})
            assert evaluate_candidate(plan.model, plan.hardware, at, "zero3", mesh).fits is fits, (key, tokens)


@pytest.mark.parametrize("model, gpus, pins, flags", [
    # The length came from zero3_offload on data parallelism alone (83,243), and the plan then refused it: '--cp 2
    # needs a sequence length divisible by 4; got 83243'.
    ("mistralai/Mixtral-8x7B-v0.1", "8xH100", {"cp": 2}, "--cp 2"),
    # The plan was shown at zero3_offload's 8,445 tokens with nothing recommended (no mesh with --tp 2 fits there).
    ("Qwen/Qwen2.5-7B", "4xA10G", {"tp": 2}, "--tp 2"),
])
def test_pinned_degrees_that_hold_no_token_say_so(model, gpus, pins, flags):
    """Under pinned degrees the plan is one of the pinned meshes, so the length is searched on those alone; where
    not one token fits any of them, one line says so and points to the plan at a fixed length (which names what
    fits without the pins). Each pinned mesh at the shortest length it can split (2 x cp tokens) does not fit."""
    with pytest.raises(ValueError, match=f"not even one token fits a mesh with {flags} at micro-batch 1"):
        advisor.plan(model, gpus, seq_len="max", **pins)
    plan = advisor.plan(model, gpus, **pins)
    meshes = [c.mesh for c in plan.candidates if c.mesh is not None]
    assert meshes and plan.recommendation is None
    for mesh in meshes:
        at = plan.training.model_copy(update={"seq_len": 2 * mesh.cp, "micro_batch_size": 1})
        assert not evaluate_candidate(plan.model, plan.hardware, at, "zero3", mesh).fits, mesh.label


def test_each_row_shows_its_own_longest():
    """The table's 'max seq' column: a mesh row shows its mesh's length (cp 8: 265,616, the plan's own length), not
    its strategy's on data parallelism alone (zero3: 33,203, which every mesh row showed)."""
    from advisor.cli.plan_view import plan_table

    plan = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len="max")
    cp8 = next(c for c in plan.candidates if c.mesh is not None and c.mesh.label == "cp 8")
    assert plan.longest_for(cp8) == plan.training.seq_len == plan.longest_seq_len["zero3 cp 8"] == 265_616
    console = Console(width=200, record=True, color_system=None)
    console.print(plan_table(plan))
    (row,) = [line for line in console.export_text().splitlines() if line.startswith("zero3 cp 8 ")]
    assert "265,616" in row and "33,203" not in row


def test_cli_json_and_bad_values():
    run = lambda *a: subprocess.run([sys.executable, "-m", "advisor.cli.main", "plan", "--model", "Qwen/Qwen2.5-0.5B",  # noqa: E731
                                     "--gpus", "2xA100", *a], capture_output=True, text=True, timeout=120)
    done = run("--seq-len", "max", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["longest_seq_len"]["ddp"] > 2048
    for bad in ("lots", "0"):
        done = run("--seq-len", bad)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--seq-len" in done.stderr


def test_the_longest_within_the_headroom_is_given_beside_the_longest():
    """The longest length fills the GPU to its last GiB (within the estimate's error of an out-of-memory failure);
    the plan also gives the longest its strategy holds within the --headroom: at that length the plan leaves 10% of
    memory free at the expected end, one token more does not, and it is shorter than the longest."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "1xA100", seq_len="max", recipe="trainer",
                        lora=LoraConfig(rank=32, targets="all-linear"), quantize="nf4", micro_batch_size=1,
                        activation_checkpointing="on")
    (reason,) = [x for x in plan.reasons if x.kind == "longest-within-headroom"]
    assert (reason.strategy, reason.longest_seq_len) == (plan.recommendation.strategy, plan.training.seq_len)
    assert reason.seq_len < reason.longest_seq_len
    for tokens, roomy in ((reason.seq_len, True), (reason.seq_len + 1, False)):
        at = plan.training.model_copy(update={"seq_len": tokens})
        cand = evaluate_candidate(plan.model, plan.hardware, at, reason.strategy)
        assert (cand.memory_range.at("expected") <= 0.9 * cand.capacity_bytes) is roomy, tokens


def test_past_the_models_context_is_said_first_and_a_mesh_gets_its_headroom_length():
    """Llama 3.1 8B on 8 x H100: the longest is a context-parallel mesh's, 265,616 tokens, past the model's 131,072
    (max_position_embeddings): that opens the why, not only an assumption. The mesh also gets the longest it holds
    within the --headroom, a length its ring attention splits (a multiple of 2 x cp) where 10% of memory stays free
    and 2 x cp tokens more do not."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len="max")
    mesh = plan.recommendation.mesh
    assert mesh is not None and mesh.cp > 1 and plan.training.seq_len > 131_072
    assert plan.reasons[0].kind == "beyond-context" and plan.reasons[0].context == 131_072
    assert plan.why[0].startswith(f"{plan.training.seq_len:,} tokens is past the model's context of 131,072 tokens")
    (roomy,) = [x for x in plan.reasons if x.kind == "longest-within-headroom"]
    assert roomy.seq_len % (2 * mesh.cp) == 0 and roomy.seq_len < roomy.longest_seq_len
    for tokens, within in ((roomy.seq_len, True), (roomy.seq_len + 2 * mesh.cp, False)):
        at = plan.training.model_copy(update={"seq_len": tokens})
        cand = evaluate_candidate(plan.model, plan.hardware, at, "zero3", mesh)
        assert (cand.memory_range.at("expected") <= 0.9 * cand.capacity_bytes) is within, tokens
    short = advisor.plan("Qwen/Qwen2.5-7B", "2xA100", seq_len="max")
    assert short.training.seq_len < 131_072 and not [x for x in short.reasons if x.kind == "beyond-context"]


def test_the_longest_keeps_the_global_batch():
    """A review: ``--global-batch 8 --seq-len max`` on 4 x A100 searched one sample without accumulation (cp 4 at
    97,856 tokens), then said nothing fits there: 8 samples over cp 4's one data-parallel rank accumulate 8 steps,
    whose held gradients leave room for fewer tokens. The length is now searched at the batch: the plan at it fits
    with the 8 steps, and a tenth more tokens does not."""
    p = advisor.plan("Qwen/Qwen2.5-7B", "4xA100", global_batch_size=8, seq_len="max")
    chosen = p.chosen
    assert chosen is not None and chosen.mesh.cp == 4 and chosen.gradient_accumulation_steps == 8
    longest = p.training.seq_len
    alone = advisor.plan("Qwen/Qwen2.5-7B", "4xA100", seq_len="max").training.seq_len
    assert longest < alone
    at = advisor.plan("Qwen/Qwen2.5-7B", "4xA100", global_batch_size=8, seq_len=longest, cp=4).chosen
    assert at is not None and at.fits
    beyond = 8 * (int(longest * 1.1) // 8)
    assert advisor.plan("Qwen/Qwen2.5-7B", "4xA100", global_batch_size=8, seq_len=beyond, cp=4).chosen is None


def test_a_batch_only_a_pipeline_splits_is_searched_on_the_pipelines():
    """A review: Llama-3.1-8B on 2 x 8 H100 with --global-batch 3 and --seq-len max said "not even one token fits":
    neither 16 GPUs nor any tp/cp mesh's data-parallel ranks divide 3, and the length search had no pipeline meshes,
    whose stages take the GPUs a single data-parallel rank leaves (the plan at 4,096 tokens runs one)."""
    p = advisor.plan("meta-llama/Llama-3.1-8B", "2x8xH100", global_batch_size=3, seq_len="max")
    assert p.chosen is not None and p.chosen.mesh.pp > 1 and p.chosen.fits
    assert advisor.plan("meta-llama/Llama-3.1-8B", "2x8xH100", global_batch_size=3, seq_len=4096).chosen.mesh.pp > 1


def test_a_batch_no_rank_count_splits_is_named_not_the_length():
    """A review: under the Trainer (no pipelines) 16 H100s split --global-batch 3 neither as data parallelism nor on a
    tp/cp mesh; --seq-len max said "not even one token fits". It names the batch, as a fixed length does; with --tp 2
    pinned (torch recipe) the pipelines with that degree are searched, as unpinned."""
    with pytest.raises(ValueError, match="--global-batch 3 cannot be split over these GPUs"):
        advisor.plan("meta-llama/Llama-3.1-8B", "2x8xH100", global_batch_size=3, seq_len="max", recipe="trainer")
    with pytest.raises(ValueError, match="--global-batch 3"):
        advisor.plan("meta-llama/Llama-3.1-8B", "2x8xH100", global_batch_size=3, seq_len=4096, recipe="trainer")
    pinned = advisor.plan("meta-llama/Llama-3.1-8B", "2x8xH100", global_batch_size=3, seq_len="max", tp=2).chosen
    assert pinned.mesh.pp > 1 and pinned.mesh.tp == 2


def test_the_default_length_stays_within_the_models_context():
    """GPT-2's learned position table has 1,024 rows (n_positions) and BERT's 512 (max_position_embeddings): a
    plan without --seq-len was shown at the default 2,048, a length neither model can take. The default stops at
    the context, said among the assumptions; a rotary model's default is 2,048 as before."""
    for model, context in (("openai-community/gpt2", 1024), ("google-bert/bert-base-uncased", 512)):
        plan = advisor.plan(model, "1xA100")
        assert plan.training.seq_len == context
        assert f"sequence length {context:,} tokens: the model's context (max_position_embeddings)" in \
            " ".join(plan.assumptions)
        assert not [x for x in plan.reasons if x.kind == "beyond-context"]
    assert advisor.plan("Qwen/Qwen2.5-0.5B", "1xA100").training.seq_len == 2048


def test_a_given_length_past_learned_positions_is_said_first_and_max_stops_at_them():
    """--seq-len 4096 on GPT-2 is planned as asked, but the why opens with the limit: a learned table of 1,024
    positions, so no longer input runs (not the RoPE scaling a rotary model's line suggests). --seq-len max on GPT-2
    holds over 100,000 tokens on an A100 by the estimate; the plan is shown at the 1,024 the model takes."""
    plan = advisor.plan("openai-community/gpt2", "1xA100", seq_len=4096)
    assert plan.training.seq_len == 4096
    assert plan.reasons[0].kind == "beyond-context" and plan.reasons[0].learned
    assert plan.why[0] == ("4,096 tokens is past the model's context of 1,024 tokens (max_position_embeddings): its "
                           "positions are a learned table of 1,024 rows, so a longer input fails (--seq-len 1024 "
                           "stays within it).")
    longest = advisor.plan("openai-community/gpt2", "1xA100", seq_len="max")
    assert longest.training.seq_len == 1024 and max(v for v in longest.longest_seq_len.values() if v) > 100_000
    assert not [x for x in longest.reasons if x.kind == "beyond-context"]
    assert "the plan is shown at the model's context, 1,024 tokens" in " ".join(longest.assumptions)
    # no offloading strategy is offered a length past the table (it called 1,024 "the longest on the GPUs alone")
    assert not [x for x in longest.reasons if x.kind == "longer-with-offload"]


def test_the_longest_with_the_fused_loss_kernel_is_given_beside_the_longest():
    """A review: Llama-3.1-8B LoRA on one H100 holds 32,939 tokens, where transformers' loss holds the logits and
    their gradient in fp32 (32,939 x 128,256 x 12 bytes = 47.2 GiB of 79.2), and only --verbose named the loss kernel
    that frees them. The answer's why now names it with the length it holds, which is the plan's own under
    --loss fused; the fused optimizer step, which frees only the adapters' temporary, adds less than 5%: no line."""
    p = advisor.plan("meta-llama/Llama-3.1-8B", "1xH100", lora=16, seq_len="max")
    length = p.training.seq_len  # 32,939 when written
    assert p.recommendation.strategy == "ddp"
    peak = p.chosen.memory_bytes
    assert peak.peak_moment == "loss_backward" and peak.temporary >= length * 128_256 * 12
    (longer,) = [x for x in p.reasons if x.kind == "longer-with-change"]
    assert (longer.change, longer.strategy, longer.plan_seq_len) == ("--loss fused", "ddp", length)
    fused = advisor.plan("meta-llama/Llama-3.1-8B", "1xH100", lora=16, seq_len="max", loss="fused")
    assert fused.recommendation.strategy == "ddp" and fused.training.seq_len == longer.seq_len > 2 * length
    assert f"With --loss fused (keeps the mathematics), ddp holds {longer.seq_len:,} tokens" in headline_reason(p)


def test_a_length_only_a_mesh_holds_on_the_gpus_alone_is_planned_on_that_mesh():
    """Qwen2.5-7B under the Trainer on 2 x A100: the longest on the GPUs alone is zero3 on a cp 2 mesh's (the
    data-parallel strategies hold 13,345 tokens at most without offload), and the plan is shown at it. It recommended
    zero3_offload there, because a mesh at 100% of the GPU did not replace an offload within the --headroom; a length
    search fills the GPU by design (its why gives the longest within the headroom), so the mesh is the plan."""
    p = advisor.plan("Qwen/Qwen2.5-7B", "2xA100", recipe="trainer", seq_len="max")
    rec = p.recommendation
    assert rec.mesh is not None and rec.mesh.cp == 2 and rec.strategy == "zero3"
    assert p.longest_seq_len[longest_key("zero3", rec.mesh)] == p.training.seq_len
    assert max(length for key, length in p.longest_seq_len.items()
               if length and " " not in key and not key.endswith("_offload")) < p.training.seq_len
    assert p.chosen.fits and not p.chosen.strategy.endswith("_offload")


def test_no_longer_length_is_offered_past_a_learned_position_table():
    """GPT-2's positions are a table of 1,024 rows: the plan is shown at 1,024 whatever fits, and no change offers a
    longer input (one that the table cannot run)."""
    p = advisor.plan("openai-community/gpt2", "1xA100", seq_len="max")
    assert p.training.seq_len == 1024 and not [x for x in p.reasons if x.kind == "longer-with-change"]


def test_an_offloading_longest_gets_the_fused_loss_line_too():
    """A review: Qwen2.5-14B on 2 x H100 holds 30,231 tokens only by offloading, and 89,153 with --loss fused; the
    line was given for GPU-only plans alone. The plan with that change holds the length the line says."""
    p = advisor.plan("Qwen/Qwen2.5-14B", "2xH100", seq_len="max")
    (longer,) = [x for x in p.reasons if x.kind == "longer-with-change"]
    assert p.chosen.strategy.endswith("_offload") and longer.change == "--loss fused"
    fused = advisor.plan("Qwen/Qwen2.5-14B", "2xH100", seq_len="max", loss="fused")
    assert fused.training.seq_len == longer.seq_len and fused.chosen.strategy == p.chosen.strategy
