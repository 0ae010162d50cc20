"""--seq-len max: for each strategy a length that fits at micro-batch 1 while 10% more does not."""

from __future__ import annotations

import json
import subprocess
import sys

import advisor
from advisor.planning.planner import evaluate_candidate


def test_each_length_fits_and_ten_percent_more_does_not():
    plan = advisor.plan("Qwen/Qwen2.5-7B", "8xH100", seq_len="max")
    found = {name: length for name, length in plan.longest_seq_len.items() if length}
    assert {"zero2", "zero3", "zero3_offload"} <= set(found)
    for name, length in found.items():
        for tokens, fits in ((length, True), (int(length * 1.1), False)):
            at = plan.training.model_copy(update={"seq_len": tokens, "micro_batch_size": 1})
            assert evaluate_candidate(plan.model, plan.hardware, at, name).fits is fits, (name, tokens)
    # The plan is shown at the longest of them, one sample per GPU.
    assert plan.training.seq_len == max(found.values()) and plan.training.micro_batch_size == 1


def test_cli_json_and_bad_values():
    run = lambda *a: subprocess.run([sys.executable, "-m", "advisor.cli.main", "plan", "--model", "Qwen/Qwen2.5-0.5B",  # noqa: E731
                                     "--gpus", "2xA100", *a], capture_output=True, text=True, timeout=120)
    done = run("--seq-len", "max", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["longest_seq_len"]["ddp"] > 2048
    for bad in ("lots", "0"):
        done = run("--seq-len", bad)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--seq-len" in done.stderr
