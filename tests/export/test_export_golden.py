"""Rendered exports of a few fixed plans equal the reviewed files in golden/.

After an intended change, run ``python tests/export/update_golden.py`` and review the diff.
"""

from __future__ import annotations

import pytest

from update_golden import GOLDEN, golden_files

EXPECTED = golden_files()


@pytest.mark.parametrize("path", sorted(EXPECTED), ids=lambda p: p.name)
def test_matches_golden(path):
    assert path.exists(), f"missing {path.name}: run python tests/export/update_golden.py"
    assert EXPECTED[path] == path.read_text(encoding="utf-8"), (
        f"{path.name} changed: if intended, run python tests/export/update_golden.py and review the diff")


def test_no_stale_golden_files():
    assert {p.name for p in GOLDEN.iterdir()} == {p.name for p in EXPECTED}
