"""Fixtures the multi-process wrappers tests share (the harness itself is ``_dist.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def checkpoint_dir(request, tmp_path_factory) -> str:
    """A checkpoint path, not yet created, that a module's gloo scenarios write and its tests read back."""
    return str(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "ckpt")
