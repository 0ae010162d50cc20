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


# Modules `advisor plan` needs only for some options: charts (--chart), the exporters and the other
# subcommands (loaded by name, advisor/cli/main.py's LazyGroup), the tracer (a cache miss), and the mesh
# estimators and the mesh search's reasons (a mesh considered), logging (a Hub download), difflib (an
# unknown GPU name).
OPTIONAL = ("advisor.cli.charts", "advisor.cli.svg", "advisor.cli.export", "advisor.cli.compare", "advisor.cli.simulate",
            "advisor.export.write", "advisor.simulate.profile", "advisor.estimate.mesh_time",
            "advisor.estimate.model_parallel", "advisor.planning.reasons.mesh", "logging", "difflib",
            "rich._emoji_codes")
PLAN_CHECK = """
import sys
from advisor.cli.main import main
main({args!r})
loaded = sorted(m for m in {names!r} if m in sys.modules)
print("LOADED:" + ",".join(loaded))
"""


def _loaded(args: list[str], names: tuple[str, ...], env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, "-c", PLAN_CHECK.format(args=args, names=names)], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("extra", [[], ["--json"], ["--lora", "16", "--quantize", "nf4"]], ids=["text", "json", "qlora"])
def test_plan_loads_neither_torch_nor_the_modules_other_options_need(extra):
    args = ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", *extra]
    assert _loaded(args, ("torch", "transformers", "accelerate", *OPTIONAL)) == "LOADED:"


def test_a_plan_only_a_mesh_fits_loads_the_mesh_estimators_and_no_torch():
    # 8B at 131072 tokens on 8 x H100: no data-parallel strategy fits, a tp x cp mesh does (plan_speed.py).
    args = ["plan", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--seq-len", "131072", "--json"]
    names = ("torch", "transformers", "advisor.estimate.mesh_time", "advisor.estimate.model_parallel",
             "advisor.planning.reasons.mesh")
    assert _loaded(args, names) == ("LOADED:advisor.estimate.mesh_time,advisor.estimate.model_parallel,"
                                    "advisor.planning.reasons.mesh")


def test_a_cached_traced_plan_loads_neither_torch_nor_the_tracer(tmp_path):
    # OPT has no activation formula: the first plan counts and traces it (torch), the second reads both
    # from the cache directory and must not load torch, transformers or the tracer.
    import os

    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIGS["opt_fallback"]))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = ["plan", "--model", str(tmp_path), "--gpus", "2xA100", "--json"]
    names = ("torch", "transformers", "advisor.simulate.profile")
    assert _loaded(args, names, env) == "LOADED:" + ",".join(sorted(names))  # cold: counted and traced
    assert list((tmp_path / "cache" / "dp-advisor" / "profiles").iterdir())
    assert _loaded(args, names, env) == "LOADED:"
