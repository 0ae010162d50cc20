"""``--compile`` through the in-process CLI: in the JSON only when given, a note on what memory it
counts (advisor.estimate.compile_memory), and a one-line refusal (exit 2) for blocks advisor.estimate.compile_time has not counted."""

from __future__ import annotations

import json

from tests.cli._main import run_main

QWEN = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--json"]


def test_json_says_compile_only_when_on(capsys):
    code, out, _ = run_main(QWEN, capsys)
    assert code == 0 and "compile" not in json.loads(out)["training"]
    code, out, _ = run_main([*QWEN, "--compile"], capsys)
    plan = json.loads(out)
    assert code == 0 and plan["training"]["compile"] is True
    chosen = next(c for c in plan["candidates"] if c["strategy"] == plan["recommendation"]["strategy"])
    assert any("advisor.estimate.compile_memory" in note for note in chosen["step_time"]["notes"])
    assert any("advisor.estimate.compile_memory" in note for note in plan["assumptions"])


def test_moe_is_refused_in_one_line(capsys):
    code, out, err = run_main(["plan", "--model", "mistralai/Mixtral-8x7B-v0.1", "--gpus", "8xH100-80GB-SXM",
                               "--compile"], capsys)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and "--compile" in err and "moe" in err, err
