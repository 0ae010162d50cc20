"""Error bars: the range from the measured errors of an estimate's kind, and --margin deciding fits."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from advisor.calibration import error_table
from advisor.estimate.error_bars import ErrorBound, ErrorTable, memory_range, relative_bounds
from advisor.planning.api import plan
from profiles import PROFILES_DIR
from tests.cli._main import run_main

SOURCE = "worked by hand"
TABLE = ErrorTable(rows=(
    ErrorBound(measured="reserved", recipe="torch", tuning="lora", low=-0.01, high=0.40, cases=12, source=SOURCE),
    ErrorBound(measured="reserved", tuning="lora", low=-0.03, high=0.47, cases=17, source=SOURCE),
    ErrorBound(measured="reserved", low=-0.05, high=0.15, cases=70, source=SOURCE),
    ErrorBound(measured="allocated", low=-0.08, high=1.54, cases=86, source=SOURCE),
))
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_spread_is_the_lowest_and_highest_ratio_pushed_out_by_the_farthest_lone_source():
    """The rule (benchmarks/error_table.py), worked by hand: ratios 0.05 and -0.02 from source a, 0.30 from b,
    0.10 from c. Min-max with zero inside: -2% .. +30%. Low end: a's lowest (-0.02) lies 0.02 below the others'
    lowest with zero (0), b's and c's lie above theirs (-0.02): pushed 0.02, to -4%. High end: b's highest
    (0.30) lies 0.20 above the others' highest (0.10), a's and c's below theirs (0.30): pushed 0.20, to +50%.
    One source alone is not pushed (nothing to compare it with); ratios all above zero keep zero as the low
    end (the range holds the estimate itself)."""
    sys.path.insert(0, str(BENCHMARKS))
    from error_table import spread

    assert spread({"a": [0.05, -0.02], "b": [0.30], "c": [0.10]}) == (-0.04, 0.50)
    assert spread({"a": [0.05, -0.02, 0.30]}) == (-0.02, 0.30)
    assert spread({"a": [0.01, 0.02]}) == (0.0, 0.02)
    assert spread({"a": [-0.123456]}) == (-0.1235, 0.0)


def test_most_specific_row_with_data_wins():
    """torch LoRA has its own row; a trainer LoRA plan falls back to every LoRA; a full fine-tune to the
    measured kind's default; an allocated figure never takes a reserved row."""
    assert relative_bounds(TABLE, family="llama", recipe="torch", tuning="lora") == (-0.01, 0.40)
    assert relative_bounds(TABLE, family="llama", recipe="trainer", tuning="lora") == (-0.03, 0.47)
    assert relative_bounds(TABLE, family="opt", recipe="torchtitan", tuning="full") == (-0.05, 0.15)
    assert relative_bounds(TABLE, family="llama", recipe="torch", tuning="lora", measured="allocated") == (-0.08, 1.54)


def test_range_worked_by_hand():
    """A full fine-tune at the default row (-5%, +15%) on 40 GiB = 42,949,672,960 bytes reserved:
    low 40,802,189,312 (x 0.95), high 49,392,123,904 (x 1.15). With the 1 GiB CUDA context
    (1,073,741,824, no measured spread) the spreads scale the 40 GiB only and the context is added as it is."""
    low, high = relative_bounds(TABLE, family="llama", recipe="torch", tuning="full")
    r = memory_range(42_949_672_960, (low, high))
    assert (r.low, r.expected, r.high) == (40_802_189_312, 42_949_672_960, 49_392_123_904)
    r = memory_range(42_949_672_960 + 1_073_741_824, (low, high), unmeasured=1_073_741_824)
    assert (r.low, r.expected, r.high) == (41_875_931_136, 44_023_414_784, 50_465_865_728)


def _stored() -> dict:
    return json.loads((PROFILES_DIR / "memory_error.json").read_text())


def _pushed(comparisons: list[dict]) -> tuple[float, float]:
    """Min-max of the ratios (zero inside), each end pushed out by the farthest one source lay beyond the
    others (zero included), written out with plain loops (not by benchmarks/error_table.py)."""
    ratios = [c["ratio"] for c in comparisons]
    low, high = min(0, *ratios), max(0, *ratios)
    below = above = 0.0
    sources = {c["source"] for c in comparisons}
    for source in sources if len(sources) > 1 else ():
        mine = [c["ratio"] for c in comparisons if c["source"] == source]
        others = [c["ratio"] for c in comparisons if c["source"] != source]
        below, above = max(below, min(0, *others) - min(mine)), max(above, max(mine) - max(0, *others))
    return low - below, high + above


def test_bundled_table_rows_are_their_comparisons_pushed_min_and_max():
    """Every stored row is the pushed min-max of the stored comparisons of its key (at least 8 of them, from at
    least two sources), and a default row exists for each measured kind. Rows are rounded outward to 4 decimals, stored ratios to the
    nearest: they differ by up to 2e-4 (two ratios enter a pushed end)."""
    data, table = _stored(), error_table()
    for row in table.rows:
        members = [c for c in data["comparisons"] if c["measured"] == row.measured
                   and all(c[name] == getattr(row, name) for name in row.level)]
        assert row.cases == len(members) and (row.level == () or (len(members) >= 8
                                                                  and len({c["source"] for c in members}) >= 2))
        assert (row.low, row.high) == pytest.approx(_pushed(members), abs=2.01e-4)
        assert row.low <= min(0, *(c["ratio"] for c in members)) and row.high >= max(0, *(c["ratio"] for c in members))
    assert {row.measured for row in table.rows if row.level == ()} == {"allocated", "reserved"}


def _held_out_hits() -> tuple[int, int]:
    """Published reserved comparisons inside the range of a table built without their source, worked here
    with ``_pushed`` over the stored comparisons (not by benchmarks/range_coverage.py)."""
    comparisons = [c for c in _stored()["comparisons"] if c["measured"] == "reserved"]
    hits = total = 0
    for c in comparisons:
        if c["source"].startswith(("h100-", "h200-")):  # our own runs
            continue
        others = [o for o in comparisons if o["source"] != c["source"]]
        for keys in (("recipe", "tuning"), ("tuning",), ()):
            group = [o for o in others if all(o[k] == c[k] for k in keys)]
            if (len(group) >= 8 and len({o["source"] for o in group}) >= 2) or keys == ():
                break
        low, high = _pushed(group)
        total += 1
        hits += low <= c["ratio"] <= high
    return hits, total


def test_held_out_coverage_in_the_report_is_the_stored_one():
    """benchmarks/results/published_memory.md states the held-out coverage of the published reserved figures;
    it is what the stored comparisons give, and at least the 21 of 23 reported (2026-11-27: torchtitan's three
    compiled runs joined the 17 of 2026-11-26, 16 held then; 15 of 17 with plain min-max, which no min-max rule
    could better: the two misses lie below every other source; 2026-11-28: torchtune's three README rows, read at
    the table's commit, became expressible; two of them lie below every other source and miss held out;
    2026-11-27: fms-acceleration's eight nvidia-smi figures, all held; 2026-11-27 again: 28 of 31 once our H100
    Trainer, torchtitan and activation-offload runs joined and a row needs two sources, the two FSDP LoRA
    nvidia-smi figures of fms on 2 A100s, +11.7% and +12.4% above the estimate, outside the Trainer LoRA rows that
    are left without them; 27 of 31 with rows of one source)."""
    text = (BENCHMARKS / "results" / "published_memory.md").read_text()
    found = re.search(r"published reserved, unspecified and nvidia-smi figures \(expressible\), held out: holds "
                      r"(\d+) of (\d+)", text)
    assert found and tuple(map(int, found.groups())) == _held_out_hits()
    hits, total = _held_out_hits()
    assert total == 41 and hits >= 38  # 2026-11-29: llama-recipes' FSDP LoRA reserved figure joined, held; then
    # Hugging Face's single-GPU docs' nine BERT nvidia-smi figures, seven held (29 of 32 -> 36 of 41); then our H200
    # runs, a source of their own, and the two estimate errors they found: all nine held (38 of 41)


def test_margin_high_makes_a_borderline_plan_not_fit():
    """Qwen2.5-7B zero3 on 2 A100s at micro-batch 1: 84,351,284,198 bytes reserved expected (99% of the
    A100's 84,987,740,160; tests/planning/test_plan_cases.py), so with no CUDA context counted it fits on
    the expected end; the high end (the torch full fine-tune row of profiles/memory_error.json, +44.09%) is
    about 84,351,284,198 x 1.4409 = 121.5e9 bytes and does not."""
    # context_gib=0: keeps the plan borderline (the 1 GiB default pushes even the expected end over).
    options = dict(strategy="zero3", micro_batch_size=1, activation_checkpointing="off", context_gib=0)
    expected = plan("Qwen/Qwen2.5-7B", "2xA100", **options).candidate("zero3")
    high = plan("Qwen/Qwen2.5-7B", "2xA100", margin="high", **options).candidate("zero3")
    assert expected.fits and expected.memory_range.expected == 84_351_284_198
    assert not high.fits and high.memory_range.high > high.capacity_bytes > high.memory_range.expected
    strict = plan("Qwen/Qwen2.5-7B", "2xA100", margin="high", **options)
    assert strict.recommendation is None and strict.why[0].startswith("zero3 does not fit at the high end")
    assert any(a.startswith("--margin high:") for a in strict.assumptions)


def test_cli_margin_and_json_range(capsys):
    code, out, _ = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--margin", "high",
                             "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["training"]["margin"] == "high"
    r = doc["candidates"][1]["memory_range"]
    assert r["low"] <= r["expected"] == doc["candidates"][1]["memory_bytes"]["total"] <= r["high"]
    code, _, err = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--margin", "huge"], capsys)
    assert code == 2 and "Traceback" not in err


def test_table_shows_the_range_beside_the_peak():
    """The peak cell reads ``expected (low-high)`` in GiB. Qwen2.5-7B zero3: 84,351,284,198 B = 78.56 GiB
    reserved + 1 GiB CUDA context and NCCL (--context-gib default) = 79.56 GiB; the torch full fine-tune row
    of profiles/memory_error.json (-22.12%: our gpu_truth runs' lowest, -15.78%, GPT-2 ddp x8, pushed out by the
    6.33 points it lies below the only other source's lowest, -9.45% (our gpu_stacks runs of the torch recipe:
    wrap() and --activation-offload, -9.45% to +9.12%); +33.69%: the gpu_truth runs' highest, +21.40%,
    Llama-3.2-1B zero3 x64, pushed out by the 12.28 points it lies above the gpu_stacks runs' +9.12%)
    scales the reserved part only: low 78.558 x 0.7788 + 1 = 62.18, high 78.558 x 1.3369 + 1 = 106.02."""
    from rich.console import Console

    from advisor.cli.plan_view import plan_table
    from advisor.units import GIB

    p = plan("Qwen/Qwen2.5-7B", "2xA100", strategy="zero3", micro_batch_size=1, activation_checkpointing="off")
    r = p.candidate("zero3").memory_range
    console = Console(width=250, record=True)
    console.print(plan_table(p))
    cell = f"{r.expected / GIB:.2f} ({r.low / GIB:.1f}-{r.high / GIB:.1f})"
    assert cell == "79.56 (62.2-106.0)" and cell in console.export_text()


def test_qlora_range_is_the_default_while_few_qlora_runs_are_measured():
    """Six QLoRA reserved figures are measured (LLaMA-Factory's, +0.4% to +7.3% now that their bf16 residual is
    planned), fewer than the 8 a row needs, so a QLoRA plan takes the default reserved row, every reserved comparison
    (-23.74%, +44.29%), pushed out by torchtune's 6.19 points below the others' -17.55% (its 70B LoRA row on 8 A100s,
    27.6 GiB of unstated kind; the others' lowest is Hugging Face's docs' BERT run at batch 1 with checkpointing on a
    V100 of 2022) and our gpu_truth runs' 23.57 points above the others' +20.72% (the same docs' batch-4 fp16 BERT
    run): -29.93%, +67.86% (from the unrounded ratios, 4 decimals rounded outward). The +44.29% is our H100 run of
    Qwen2.5-0.5B LoRA under FSDP2 x8, full checkpointing and the fused loss (re-measured 2026-11-27): 3.66 GiB
    reserved for 2.02 allocated, the plan 2.54 with the allocator's cache under checkpointing. (Before our H200 runs
    of 2026-11-29 found two estimate errors in the docs' BERT rows: -30.22%, +65.46%; before those rows joined:
    -31.70%, +71.26%.) Llama-2-70B nf4 on 2 RTX 4090s: --margin high leaves room for a smaller micro-batch only."""
    row = error_table().bound(measured="reserved", recipe="torch", tuning="qlora", family="llama")
    assert row.level == () and (row.low, row.high) == (-0.2993, 0.6786)
    options = dict(lora=64, quantize="nf4", strategy="zero3_offload")
    cand = plan("meta-llama/Llama-2-70b-hf", "2xRTX4090", **options).candidate("zero3_offload")
    mem, span = cand.memory_bytes, cand.memory_range
    # the range is of what must fit: reserved less the blocks the allocator frees before failing (recompute_cache)
    assert cand.fits and span.high - mem.outside_allocator == int((1 + row.high) * (mem.total - mem.outside_allocator))
    cautious = plan("meta-llama/Llama-2-70b-hf", "2xRTX4090", margin="high", **options).candidate("zero3_offload")
    assert cautious.micro_batch_size < cand.micro_batch_size
