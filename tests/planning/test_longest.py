"""--seq-len max: for each strategy a length that fits at micro-batch 1 while 10% more does not."""

from __future__ import annotations

import json
import subprocess
import sys

import advisor
from advisor.planning.candidates import evaluate_candidate
from advisor.strategies import STRATEGIES


def test_each_length_fits_and_ten_percent_more_does_not():
    plan = advisor.plan("Qwen/Qwen2.5-7B", "8xH100", seq_len="max")
    found = {name: length for name, length in plan.longest_seq_len.items() if length and name in STRATEGIES}
    assert {"zero2", "zero3", "zero3_offload"} <= set(found)
    for name, length in found.items():
        for tokens, fits in ((length, True), (int(length * 1.1), False)):
            at = plan.training.model_copy(update={"seq_len": tokens, "micro_batch_size": 1})
            assert evaluate_candidate(plan.model, plan.hardware, at, name).fits is fits, (name, tokens)
    # The plan is shown at the longest of them (meshes included), one sample per GPU.
    assert plan.training.seq_len == max(v for v in plan.longest_seq_len.values() if v)
    assert plan.training.micro_batch_size == 1


def test_meshes_are_searched_too():
    """Llama-3.1-8B on 8 x H100: the longest data-parallel length is zero3_offload's, 39,710 tokens; context
    parallelism over the 8 GPUs holds 265,616 (the search ignored meshes before: 39,710 was the answer).
    Each mesh's length fits on that mesh at micro-batch 1 and 10% more (in whole 2 x cp chunks) does not."""
    plan = advisor.plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len="max")
    longest = plan.longest_seq_len
    assert longest["zero3_offload"] == max(v for k, v in longest.items() if k in STRATEGIES and v) == 39_710
    assert plan.training.seq_len == longest["zero3 cp 8"] == 265_616
    assert plan.recommendation is not None and plan.recommendation.mesh.cp == 8
    meshes = {f"{c.strategy} {c.mesh.label}": c.mesh for c in plan.candidates if c.mesh is not None}
    assert set(meshes) == {k for k in longest if k not in STRATEGIES}
    for key, mesh in meshes.items():
        step = 2 * mesh.cp
        for tokens, fits in ((longest[key], True), (int(longest[key] * 1.1) // step * step, False)):
            at = plan.training.model_copy(update={"seq_len": tokens, "micro_batch_size": 1})
            assert evaluate_candidate(plan.model, plan.hardware, at, "zero3", mesh).fits is fits, (key, tokens)


def test_cli_json_and_bad_values():
    run = lambda *a: subprocess.run([sys.executable, "-m", "advisor.cli.main", "plan", "--model", "Qwen/Qwen2.5-0.5B",  # noqa: E731
                                     "--gpus", "2xA100", *a], capture_output=True, text=True, timeout=120)
    done = run("--seq-len", "max", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["longest_seq_len"]["ddp"] > 2048
    for bad in ("lots", "0"):
        done = run("--seq-len", bad)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--seq-len" in done.stderr
