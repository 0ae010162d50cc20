"""benchmarks/allocator_gap.py: the least-relative-squares fit of a reserved-memory model, worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from allocator_gap import CANDIDATES, Run, fit, predict  # noqa: E402


def _run(allocated: float, states: float, reserved: float, checkpointed: bool = False) -> Run:
    return Run("hand", allocated, states, checkpointed, 0.0, allocated, reserved)


def test_two_runs_fix_two_coefficients_exactly():
    """Run A: 10 GiB allocated, 6 of states (4 transient), 13 reserved; run B: 20 allocated, 4 of states (16
    transient), 29 reserved. Two runs, two unknowns, so every weighting gives the exact solution:
    transient: 10 + 4f + c = 13 and 20 + 16f + c = 29 give f = 0.5, c = 1;
    proportional: 10p + c = 13 and 20p + c = 29 give p = 1.6, c = -3."""
    runs = [_run(10, 6, 13), _run(20, 4, 29)]
    names = {c.name: c for c in CANDIDATES}
    assert fit(names["transient"], runs) == pytest.approx([0.5, 1.0])
    assert fit(names["proportional (today's form)"], runs) == pytest.approx([1.6, -3.0])
    # A third run, 30 allocated with 10 of states: 30 + 0.5 x 20 + 1 = 41 GiB reserved by the transient model.
    assert predict(names["transient"], [0.5, 1.0], _run(30, 10, 0), 30) == pytest.approx(41.0)


def test_checkpointed_runs_take_their_own_share():
    """transient x checkpointing: reserved = allocated + f_ckpt x transient (checkpointed) or f x transient.
    A checkpointed run, 8 allocated, 2 of states, 11 reserved: 8 + 6 f_ckpt = 11, f_ckpt = 0.5; a plain one, 8
    allocated, 4 of states, 9 reserved: 8 + 4 f = 9, f = 0.25."""
    cand = next(c for c in CANDIDATES if c.name == "transient x checkpointing")
    assert fit(cand, [_run(8, 2, 11, checkpointed=True), _run(8, 4, 9)]) == pytest.approx([0.5, 0.25])
