"""--float8 at the CLI: the field in the plan's JSON, one-line refusals (exit 2), the export's warning."""

from __future__ import annotations

import json

import pytest

from tests.cli._main import run_main


def test_plan_json_carries_float8(capsys):
    code, out, _ = run_main(["plan", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "2xH100", "--float8",
                             "--strategy", "zero3", "--json"], capsys)
    assert code == 0
    training = json.loads(out)["training"]
    assert training["float8"] is True and "float8_all_gather" not in training


@pytest.mark.parametrize("args, says", [
    (["--gpus", "2xA100", "--float8"], "has no fp8 tensor cores"),
    (["--gpus", "1xT4", "--float8"], "has no fp8 tensor cores"),
    (["--gpus", "2xH100", "--float8-all-gather"], "needs --float8"),
    (["--gpus", "2xH100", "--float8", "--lora", "8"], "not with --lora"),
])
def test_refusals_are_one_line_exit_2(capsys, args, says):
    code, out, err = run_main(["plan", "--model", "meta-llama/Llama-3.2-1B", *args], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and not out


def test_a_size_alone_is_refused_for_its_missing_linears_not_for_lora(capsys):
    """--params names no linear layer for torchao to convert; the refusal said "LoRA counting needs a known
    architecture" though no LoRA was asked (the review of issue 19)."""
    code, out, err = run_main(["plan", "--params", "3B", "--gpus", "2x8xH100", "--float8"], capsys)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert "--float8 needs the model's linear layers" in err and "LoRA" not in err


def test_export_writes_float8_where_the_format_can_and_notes_it_where_not(capsys):
    """torchtitan has a float8 converter key (tests/export/test_export_compile_float8.py); torchrun has none."""
    code, out, err = run_main(["export", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "2xH100", "--float8",
                               "--format", "torchtitan", "-o", "-"], capsys)
    assert code == 0 and 'converters = ["quantize.linear.float8"]' in out and "(--float8)" not in err
    code, out, err = run_main(["export", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "2xH100", "--float8",
                               "--format", "torchrun", "-o", "-"], capsys)
    assert code == 0 and "(--float8): no torchrun key says it" in err
