"""``--quantize`` and LoRA bad input through the in-process CLI: one line on stderr, exit 2, no
traceback; unavailable quantisation/strategy pairs are listed with their reason when not pinned."""

from __future__ import annotations

import json

import pytest

from tests.cli._main import run_main

QWEN = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100"]


@pytest.mark.parametrize("args, says", [
    (["--quantize", "nf4"], "needs --lora RANK"),
    (["--lora", "8", "--quantize", "nf4", "--strategy", "dp"], "DataParallel"),
    (["--lora", "8", "--quantize", "int8", "--strategy", "zero3"], "int8"),
    (["--lora", "8", "--quantize", "int8", "--engine", "deepspeed", "--strategy", "zero3"], "int8"),
    (["--lora", "8", "--quantize", "q3"], "--quantize"),
    (["--lora", "0"], "--lora"),
    (["--lora", "8", "--lora-targets", "attn"], "lm_head"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, says):
    code, out, err = run_main([*QWEN, *args], capsys)
    assert code == 2, (args, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and says in err, err


def test_unknown_target_lists_every_linear_once(capsys):
    """Qwen2's block: q, k, v, o, gate, up, down projections; outside the blocks: lm_head."""
    _, _, err = run_main([*QWEN, "--lora", "8", "--lora-targets", "attn"], capsys)
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head (or all-linear)" in err


def test_unpinned_unavailable_pairs_are_listed_with_the_reason(capsys):
    code, out, _ = run_main([*QWEN, "--lora", "8", "--quantize", "int8", "--json"], capsys)
    assert code == 0
    by_name = {c["strategy"]: c for c in json.loads(out)["candidates"]}
    assert not by_name["dp"]["available"] and "DataParallel" in by_name["dp"]["unavailable_reason"]
    assert not by_name["zero3"]["available"] and "int8" in by_name["zero3"]["unavailable_reason"]
    assert by_name["ddp"]["available"] and by_name["ddp"]["fits"]


def test_nf4_deepspeed_zero3_runs(capsys):
    """PEFT's docs train QLoRA under DeepSpeed ZeRO-3 (bnb_4bit_quant_storage=bfloat16): available."""
    code, out, _ = run_main([*QWEN, "--lora", "8", "--quantize", "nf4", "--engine", "deepspeed",
                             "--strategy", "zero3", "--json"], capsys)
    assert code == 0 and json.loads(out)["recommendation"]["strategy"] == "zero3"


def test_simulate_refuses_a_quantised_base(capsys):
    """The simulator's fake tensors cannot run bitsandbytes: refused in one line, not simulated unquantised."""
    code, _, err = run_main(["simulate", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--lora", "8",
                             "--quantize", "nf4", "--strategy", "ddp", "--micro-batch", "1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "bitsandbytes" in err, err


def test_no_double_quant_keeps_fp32_absmax(capsys):
    """Without double quantisation the absmax stay fp32: 4 B per 64 weights, 4x the 0.127-bit constants."""
    code, out, _ = run_main([*QWEN, "--lora", "8", "--quantize", "nf4", "--no-double-quant", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["training"]["double_quant"] is False
    assert any("fp32 absmax, 0.5 bits/weight" in note for note in doc["assumptions"])
