"""Rewrite tests/planning/golden/ from the current code (see tests/planning/plan_golden.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.planning.plan_golden import CASES, GOLDEN_DIR, run_case  # noqa: E402

if __name__ == "__main__":
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name, args in CASES.items():
        code, output = run_case(args)
        (GOLDEN_DIR / name).write_text(f"exit {code}\n{output}")
        print(f"wrote {GOLDEN_DIR / name} (exit {code})")
