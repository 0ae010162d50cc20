"""`advisor plan` output, table and JSON, against reviewed golden files (tests/planning/plan_golden.py)."""

from __future__ import annotations

import pytest

from tests.planning.plan_golden import CASES, GOLDEN_DIR, run_case


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_output_matches_golden(name):
    code, output = run_case(CASES[name])
    expected = (GOLDEN_DIR / name).read_text()
    assert f"exit {code}\n{output}" == expected, (
        f"{name} changed; if intended, run `python tests/planning/update_plan_golden.py` and review the diff"
    )
