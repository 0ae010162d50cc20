"""``--transformers-release``: the transformers release a run uses. Before 5.0.0 the Trainer's checkpointing is
reentrant (profiles/library_releases.json gradient_checkpointing_non_reentrant), which decides what LLM.int8 linears
keep (tests/estimate/test_quantized.py has the bytes). Axolotl's Llama-2 7B int8 LoRA example (transformers 4.31,
one RTX 4090, 4,096 packed tokens x micro-batch 2, README: 'about 20 GB'): planned on today's non-reentrant release
nothing fits at micro-batch 2; on 4.31 it fits, every layer's kept inputs gone but the recomputed one's."""

from __future__ import annotations

import json

import pytest

from tests.cli._main import run_main

JOB = ["plan", "-m", "meta-llama/Llama-2-7b-hf", "-g", "1xRTX4090", "--recipe", "trainer", "--lora", "32",
       "--lora-targets", "all-linear", "--lora-dropout", "0.05", "--quantize", "int8", "--optimizer", "adamw-8bit",
       "--seq-len", "4096", "--micro-batch", "2", "--global-batch", "8", "--strategy", "ddp",
       "--activation-checkpointing", "on", "--json"]


def _ddp(doc: dict) -> dict:
    return next(c for c in doc["candidates"] if c["strategy"] == "ddp")


def test_the_release_reaches_the_plan_and_is_said(capsys):
    code, out, err = run_main([*JOB, "--transformers-release", "4.31.0"], capsys)
    assert code == 0, err
    old = json.loads(out)
    assert old["training"]["transformers_release"] == "4.31.0"
    assert ("transformers 4.31.0 (--transformers-release): activation checkpointing through transformers' "
            "gradient_checkpointing_enable(): reentrant (gradient_checkpointing_enable() passes use_reentrant=True "
            "before 5.0.0)") in old["assumptions"]
    assert _ddp(old)["fits"]
    code, out, _ = run_main(JOB, capsys)
    new = json.loads(out)
    assert "transformers_release" not in new["training"]
    assert not any("--transformers-release" in a for a in new["assumptions"])
    # 32 layers' int8 inputs at 8,192 tokens (bf16 hidden: norm outputs, attention output, act * up) held to the loss
    assert not _ddp(new)["fits"]
    assert _ddp(new)["memory_bytes"]["activations"] + _ddp(new)["memory_bytes"]["temporary"] > \
        _ddp(old)["memory_bytes"]["activations"] + _ddp(old)["memory_bytes"]["temporary"] + 8 * 2**30


def test_a_stack_with_its_own_checkpoint_says_so(capsys):
    args = [a for a in JOB if a not in ("--recipe", "trainer")]
    code, out, err = run_main([*args, "--transformers-release", "4.31.0"], capsys)
    assert code in (0, 3), err
    note = next(a for a in json.loads(out)["assumptions"] if "--transformers-release" in a)
    assert note.endswith("with torch's own checkpoint (the torch recipe, whatever the release): non-reentrant")


@pytest.mark.parametrize("value", ["abc", ""])
def test_a_release_that_is_no_number_is_one_line_and_exit_2(value, capsys):
    code, out, err = run_main([*JOB, "--transformers-release", value], capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert "is not a release number" in err and len(err.strip().splitlines()) == 1, err
