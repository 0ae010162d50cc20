"""A small seeded subset of the randomized sweep (``benchmarks/sweep.py``), plus one fresh seed per run.

Each case plans a random tiny job as ``advisor plan`` does and runs the step PyTorch executes
(``advisor simulate``'s path, fake tensors on the CPU); the estimate must be within the sweep's goals
(issue 20: p90 <= 1% and max <= 3%); the fresh case fails only beyond the worst error the committed sweep
records outside the known gaps, and is reported as a warning between the goal and that. The fresh seed is the
checked-out commit's (its hash's first 31 bits; ``SWEEP_SEED`` overrides, and outside a git checkout it is
random): every commit draws new cases, and the run CI makes of a commit draws the same ones as the run made
before it was submitted, so a hole is found before it lands, not by chance after. It is printed (``pytest -s``
shows it; a failure's message repeats it) so a failure can be replayed with
``python benchmarks/sweep.py --seed N --cases 8``.
Cases of a known, diagnosed gap (``sweep_cases.known_gap``) are drawn again: the full sweep measures
them, this test guards what the estimate models.
"""

from __future__ import annotations

import os
import random
import subprocess
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


def _worst_recorded_outside_gaps() -> float:
    """The largest |error| of the committed sweep's measured cases that no known gap covers."""
    import json

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "sweep.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max(abs(r["err_pct"]) for r in rows if r["status"] == "ok"
               and known_gap({k: r[k] for k in ("family", "kind", "config", "job")}) is None)


def test_the_recorded_worst_is_the_summary_figure():
    """The bound the fresh seed is held to is the one the sweep's report prints (no other number)."""
    summary = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "sweep_summary.md").read_text()
    assert f"max {_worst_recorded_outside_gaps():.2f}%." in summary.split("## Outside the known gaps")[1].split("\n\n")[1]


def fresh_seed() -> int:
    """``SWEEP_SEED``, else the checked-out commit's hash's first 31 bits, else a random seed."""
    if os.environ.get("SWEEP_SEED"):
        return int(os.environ["SWEEP_SEED"])
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        return int(head[:8], 16) >> 1 or 1
    except (OSError, subprocess.SubprocessError, ValueError):
        return random.SystemRandom().randrange(1, 2**31)


def test_fresh_seed_within_goal():
    seed = fresh_seed()
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
        message = f"{replay}: {describe(row)}: {row['err_pct']:+.2f}%"
        worst = _worst_recorded_outside_gaps()
        # A fresh case between the goal and the worst the committed sweep records outside the gaps is reported,
        # not failed (that error is known and published); a case beyond it is new, and fails.
        assert abs(row["err_pct"]) <= max(MAX_GOAL, worst), f"{message}: worse than any recorded ({worst:.2f}%)"
        if abs(row["err_pct"]) > MAX_GOAL:
            warnings.warn(f"sweep goal missed (recorded cases reach {worst:.2f}%): {message}", stacklevel=1)
        return
    pytest.skip(f"seed {seed}: no case in the first 8 outside the known gaps")
