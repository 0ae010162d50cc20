"""The allocator's cache under checkpointing (``MemoryBreakdown.recompute_cache``, profiles/allocator_overhead.json
``checkpointing_fragmentation``): on our H100 the runs that recompute their blocks reserved 6-37% above what they
allocated, those that do not 2-21% (benchmarks/results/gpu_stacks.md). A recomputing plan's reserved carries the term
on its peak; what must fit (``total``) does not, since the allocator frees cached blocks before it fails an
allocation. CPU only, no network."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from advisor.planning.api import plan
from advisor.units import GIB

ROOT = Path(__file__).resolve().parents[2]
PROFILE = json.loads((ROOT / "profiles/allocator_overhead.json").read_text())


def _zero3(**options):
    return plan("Qwen/Qwen2.5-0.5B", "8xH100", strategy="zero3", micro_batch_size=4, seq_len=2048,
                **options).candidate("zero3").memory_bytes


def test_checkpointed_reserved_carries_the_term_on_its_peak():
    """The stored H100 runs that recompute their blocks and whose reserved peak is the training's (15:
    benchmarks/results/gpu_stacks.jsonl, the Trainer, wrap(), Lightning, torchtitan-unit and activation-offload rows;
    7 of them among the 13 runs the term was fit on): the plan's reserved within a median 3.0% of what the GPU
    reserved with the term, 5.3% without it (reserved less ``recompute_cache``); and what must fit leaves it out."""
    import statistics

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_stacks_report

    rows = [r for r in gpu_stacks_report.load() if r["kind"] in gpu_stacks_report.RESERVED_SCORED and r["checkpointing"]
            and r["env"]["device"].startswith("NVIDIA H100")]
    assert len(rows) == 15
    with_term, without = [], []
    for row in rows:
        mem = gpu_stacks_report.estimate(row)
        assert mem.recompute_cache > 0 and mem.total - mem.outside_allocator < mem.reserved
        with_term.append(abs(mem.reserved / row["reserved"] - 1))
        without.append(abs((mem.reserved - mem.recompute_cache) / row["reserved"] - 1))
    assert statistics.median(with_term) < 0.035 < 0.05 < statistics.median(without)


def test_nothing_without_recomputation_or_with_a_given_fragmentation():
    """No recomputation: no term. --fragmentation given: the whole gap is as given, with or without checkpointing."""
    assert _zero3(activation_checkpointing="off").recompute_cache == 0
    assert _zero3(activation_checkpointing="selective").recompute_cache > 0  # selective recomputes too
    given = _zero3(activation_checkpointing="on", fragmentation=0.2)
    assert given.recompute_cache == 0
    assert given.runtime_overhead == given.outside_allocator + int(0.2 * given.peak_allocated) + int(0.256 * GIB)


def test_reserved_stops_at_the_gpus_memory():
    """Llama-3.1-8B LoRA r8, pure bf16, on one RTX 4090 at 3,072 tokens: total 23.03 GiB of the card's 23.52 GiB
    fits; the term's 7.8% of the peak (1.57 GiB) cannot all stay cached beside it, so reserved + the context stops at
    the card's memory (the allocator frees cached blocks before an allocation fails)."""
    result = plan("meta-llama/Llama-3.1-8B", "1xRTX4090", lora=8, precision="bf16", micro_batch_size=1,
                  activation_checkpointing="on", seq_len=3072, strategy="ddp")
    cand = result.candidate("ddp")
    mem = cand.memory_bytes
    assert cand.fits and mem.total < result.hardware.gpu_memory_bytes
    assert 0 < mem.recompute_cache < int(0.078 * mem.peak_allocated)
    assert mem.reserved + mem.outside_allocator == result.hardware.gpu_memory_bytes


def test_the_profiles_term_is_what_the_stored_runs_give():
    """``published_memory.py --fit-recompute``: the term refitted on the stored H100 runs (every other recomputing
    one, the base gap given) is the profile's, and held out it beats the base gap alone on the other half."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import published_memory

    everything = published_memory.gpu_truth_pairs(stacks=True)
    term = published_memory.fit_recompute(everything[0::2], PROFILE["fragmentation"], PROFILE["allocator_constant_gib"])
    assert round(term, 3) == PROFILE["checkpointing_fragmentation"]

    def error(pair, extra):
        estimate = (1 + PROFILE["fragmentation"] + extra * pair.checkpointing) * pair.allocated
        return abs(estimate + PROFILE["allocator_constant_gib"] * GIB - pair.reserved) / pair.reserved

    held = [p for p in everything[1::2] if p.checkpointing]
    assert len(held) >= 20
    assert sum(error(p, term) for p in held) < sum(error(p, 0.0) for p in held)


@pytest.mark.parametrize("kind", ["reserved", "nvidia-smi"])
def test_published_reserved_and_nvidia_smi_within_fifteen_percent(kind):
    """benchmarks/results/published_memory.md: with the term, the published reserved figures (12) and nvidia-smi
    figures (10) whose settings we can express, the sources the term was judged on, are within 15% (14.8% and 11.4%;
    20.3% and 16.3% without it). Hugging Face's single-GPU docs' nine BERT nvidia-smi figures, added later, are not
    (-17.0% to +26.7%, the proportional gap on a step of model states and of eager activations; the report's
    summary line counts them: 19 cases, max 26.7%)."""
    text = (ROOT / "benchmarks/results/published_memory.md").read_text()
    if kind == "reserved":
        line = next(ln for ln in text.splitlines() if "`reserved` vs published reserved" in ln)
        worst = float(line.split("max ")[1].split("%")[0])
    else:
        lines = [ln for ln in text.splitlines() if ", nvidia-smi: median" in ln and not ln.startswith("  - hfdocs")]
        assert len(lines) >= 3
        worst = max(float(ln.split("max ")[1].split("%")[0]) for ln in lines)
    assert worst <= 15.0


@pytest.mark.parametrize("seq_len, says", [(9728, False), (10240, False), (10752, True)])
def test_the_stream_pool_line_speaks_of_the_pool_alone(seq_len, says):
    """Llama-3.1-8B zero3 on 8 H100s, micro-batch 3, full checkpointing. At 9,728 and 10,240 tokens (total 71.59 and
    74.48 GiB) FSDP's 3.74 GiB of cached gradient blocks fit beside the rest; only the recompute cache is cut at the
    GPU's memory, so the line that the shards cannot stay cached is not printed (it was, while it read reserved). At
    10,752 tokens (77.38 GiB) the pool itself is cut to 1.8 GiB, and the line is printed."""
    from advisor.planning.notes import stream_pool_note

    result = plan("meta-llama/Llama-3.1-8B", "8xH100", strategy="zero3", micro_batch_size=3,
                  activation_checkpointing="on", seq_len=seq_len)
    mem = result.candidate("zero3").memory_bytes
    assert (stream_pool_note(mem, result.hardware.gpu_memory_bytes) is not None) == says


def test_a_configuration_read_back_from_json_keeps_the_term():
    """A plan's JSON writes both fields; a TrainingConfig built from them adds the term as the plan did. One given
    ``fragmentation`` alone means the whole gap as given."""
    from advisor.training import TrainingConfig

    written = TrainingConfig(activation_checkpointing="on").model_dump(mode="json")
    assert (written["fragmentation"], written["checkpointing_fragmentation"]) == (0.104, 0.078)
    assert TrainingConfig.model_validate(written).gap_fraction(True) == pytest.approx(0.182)
    assert TrainingConfig(fragmentation=0.104).gap_fraction(True) == 0.104
    assert TrainingConfig(fragmentation=0.1, checkpointing_fragmentation=0.05).gap_fraction(True) == pytest.approx(0.15)


def test_paged_optimizer_state_on_the_gpu_leaves_the_cache_what_is_left():
    """bitsandbytes' paged 8-bit AdamW on one L40S (Llama-3.1-8B full fine-tune, pure bf16, the optimizer in backward,
    micro-batch 2 x 3,072 tokens, checkpointing): the 14.96 GiB paged state fits beside the total, 44.07 of 44.31 GiB,
    and stays on the GPU outside the allocator; the blocks cached around recomputation then get only what is left,
    so reserved + what lies outside the allocator is the card's memory, not more."""
    result = plan("meta-llama/Llama-3.1-8B", "1xL40S", optimizer="adamw-8bit-paged", precision="bf16",
                  micro_batch_size=2, seq_len=3072, activation_checkpointing="on", strategy="ddp",
                  optimizer_in_backward=True)
    mem = result.candidate("ddp").memory_bytes
    assert mem.paged_on_cpu == 0 and mem.total <= result.hardware.gpu_memory_bytes
    assert 0 < mem.recompute_cache < int(0.078 * mem.peak_allocated)
    assert mem.reserved + mem.outside_allocator == result.hardware.gpu_memory_bytes
