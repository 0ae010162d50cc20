"""The planning hot path never imports torch or transformers (timings live in benchmarks/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TINY_CONFIGS

CHECK = """
import sys
from advisor.cli.main import main
main({args!r})
heavy = sorted(m for m in ("torch", "transformers", "accelerate", "huggingface_hub") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


def _heavy_modules(args: list[str]) -> str:
    result = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-7B", "openai-community/gpt2", "mistralai/Mixtral-8x7B-v0.1"])
def test_inspect_bundled_is_torch_free(model):
    assert _heavy_modules(["inspect", model]) == "HEAVY:"


def test_inspect_local_known_architecture_is_torch_free(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIGS["qwen2_bias_gqa"]))
    assert _heavy_modules(["inspect", str(tmp_path)]) == "HEAVY:"
