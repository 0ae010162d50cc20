"""A small seeded subset of the randomized sweep (``benchmarks/sweep.py``), plus one fresh seed per run.

Each case plans a random tiny job as ``advisor plan`` does and runs the step PyTorch executes
(``advisor simulate``'s path, fake tensors on the CPU); the estimate must be within the sweep's goals
(issue 20: p90 <= 1% and max <= 3%). The fresh seed is printed (``pytest -s`` shows it; a failure's
message repeats it) so a failure can be replayed with ``python benchmarks/sweep.py --seed N --cases 1``.
Cases of a known, diagnosed gap (``sweep_cases.known_gap``) are drawn again: the full sweep measures
them, this test guards what the estimate models.
"""

from __future__ import annotations

import random
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from sweep import run_case  # noqa: E402
from sweep_cases import draw_case, known_gap  # noqa: E402
from sweep_report import MAX_GOAL, P90_GOAL, describe, percentile  # noqa: E402

pytest.importorskip("torch")

# (seed, index) of cases that simulate in a few seconds: a formula family under DDP with selective
# checkpointing and the chunked loss in fp32 (the head-gradient case), one under FSDP2 (zero2) with LoRA,
# a traced family under FSDP2 (zero3) with full checkpointing.
SUBSET = ((0, 3), (0, 14), (0, 16))


def _measure(seed: int, index: int) -> dict:
    warnings.filterwarnings("ignore")
    row = run_case(draw_case(seed, index))
    assert row["status"] == "ok", f"replay: python benchmarks/sweep.py --seed {seed} --cases {index + 1}: {row}"
    return row


def test_seeded_subset_within_goals():
    rows = [_measure(seed, index) for seed, index in SUBSET]
    errors = [abs(r["err_pct"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["err_pct"]))
    assert max(errors) <= MAX_GOAL, f"{describe(worst)}: {worst['err_pct']:+.2f}% ({worst['est_moment']})"
    assert percentile(errors, 0.9) <= P90_GOAL or len(errors) < 10


def test_fresh_seed_within_goal():
    seed = random.SystemRandom().randrange(1, 2**31)
    print(f"sweep fresh seed {seed}: replay with python benchmarks/sweep.py --seed {seed} --cases 8")
    for index in range(8):  # the first case of the seed that the planner supports and no known gap covers
        case = draw_case(seed, index)
        if known_gap(case) is not None:
            continue
        warnings.filterwarnings("ignore")
        row = run_case(case)
        if row["status"] == "unsupported":
            continue
        replay = f"seed {seed} index {index} (python benchmarks/sweep.py --seed {seed} --cases {index + 1})"
        assert row["status"] == "ok", f"{replay}: {row['status']}: {row['message']}"
        assert abs(row["err_pct"]) <= MAX_GOAL, f"{replay}: {describe(row)}: {row['err_pct']:+.2f}%"
        return
    pytest.skip(f"seed {seed}: no case in the first 8 outside the known gaps")
