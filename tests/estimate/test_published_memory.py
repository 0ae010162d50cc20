"""The estimate against published real-GPU peaks (profiles/published_memory.json): every case is
cited and says what its figure measured, and the expressible cases stay within the error measured by
benchmarks/published_memory.py (benchmarks/results/published_memory.md)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from profiles import PROFILES_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from published_memory import estimate, published_bytes  # noqa: E402

DATA = json.loads((PROFILES_DIR / "published_memory.json").read_text())
CASES = DATA["cases"]
KINDS = {"allocated", "reserved", "active", "nvidia-smi", "unspecified"}
EXPRESSIBLE = [c for c in CASES if not c["not_expressible"]]


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
        assert case["unit"] in ("GiB", "GB") and case["figure"] > 0, case["id"]
        assert isinstance(case["not_expressible"], list) and isinstance(case.get("approximated", []), list)
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
    median |error| 7.4% over 21 cases, every case within -33%..+9%
    (the low end: Answer.AI's CPU-offload batch-10 run, reserved near the 24 GB card's capacity)."""
    errors = [_error(c) for c in EXPRESSIBLE if not c.get("quantize")]
    assert len(errors) >= 15
    assert all(-0.35 <= e <= 0.10 for e in errors), errors
    assert statistics.median(abs(e) for e in errors) <= 0.10


def test_qlora_runs_measure_more_than_the_estimate():
    """Every published litgpt QLoRA peak lies above our allocated estimate (-25% to -31% measured), the
    direction profiles/memory_error.json's QLoRA row widens the range for; none above it."""
    errors = [_error(c) for c in EXPRESSIBLE if c.get("quantize")]
    assert len(errors) >= 5
    assert all(-0.35 <= e < 0 for e in errors), errors
