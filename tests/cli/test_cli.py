"""The CLI as a user meets it: tables, --json, one-line errors with exit code 2, no tracebacks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from advisor.cli.main import cli
from tests.cli._main import run_main


def test_inspect_table():
    result = CliRunner().invoke(cli, ["inspect", "Qwen/Qwen2.5-7B"])
    assert result.exit_code == 0, result.output
    assert "7,615,616,512" in result.output and "Qwen2DecoderLayer" in result.output


def test_inspect_json_is_one_document():
    result = CliRunner().invoke(cli, ["inspect", "meta-llama/Llama-3.2-1B", "--json"])
    doc = json.loads(result.output)
    assert doc["total_params"] == 1_235_814_400 and doc["tied_embeddings"] is True
    assert doc["num_kv_heads"] == 8 and doc["architecture"] == "LlamaForCausalLM"


def test_inspect_size():
    doc = json.loads(CliRunner().invoke(cli, ["inspect", "7.5B", "--json"]).output)
    assert doc["total_params"] == 7_500_000_000 and doc["source"] == "params"


def test_inspect_labels_an_moe_width_as_one_experts():
    """Qwen3-30B-A3B's config: moe_intermediate_size 768 (one expert), intermediate_size 6144 (unused by its
    blocks); the table said "intermediate size 768" (a review)."""
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in CliRunner().invoke(cli, ["inspect", "Qwen/Qwen3-30B-A3B"]).output.splitlines() if "│" in line}
    assert rows["expert intermediate size"] == "768" and "intermediate size" not in rows


def test_gpus_lists_profiles():
    result = CliRunner().invoke(cli, ["gpus"])
    assert result.exit_code == 0 and "H100-80GB-SXM" in result.output and "MI300X" in result.output


def test_gpus_json_names_the_nominal_size_apart_from_the_memory_plans_fit_against():
    """A review: gpus --json's memory_gib was the product name's 16 for a V100-16GB whose table column read 15.75,
    one label for two numbers. deviceQuery's 16,128 MBytes (profiles/gpus.json's note) = 15.75 GiB."""
    rows = {g["name"]: g for g in json.loads(CliRunner().invoke(cli, ["gpus", "--json"]).output)["gpus"]}
    v100 = rows["V100-16GB"]
    assert (v100["nominal_memory_gb"], v100["memory_bytes"] / 2**30) == (16, 16_128 / 1024)
    assert "memory_gib" not in v100
    table = CliRunner().invoke(cli, ["gpus"]).output
    assert next(line for line in table.splitlines() if "V100-16GB" in line).split("│")[2].strip() == "15.75"


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "not/a-model-anywhere-xyz"],
        ["inspect", ""],
        ["inspect", "x" * 10_000],
        ["inspect", "Qwen/Qwen2.5-7B", "--bogus-flag"],
        ["nosuchcommand"],
    ],
)
def test_bad_input_one_line_exit_2(args, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # what the hub read at import
    code, out, err = run_main(args, capsys)
    assert code == 2
    assert err.startswith("advisor: error:") and err.count("\n") == 1, err
    assert "Traceback" not in out + err


def test_help_and_version(capsys):
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0 and "inspect" in out
    code, out, _ = run_main(["--version"], capsys)
    assert code == 0 and "0.1.0" in out


def test_bare_advisor_prints_the_help_page_as_click_groups_do(capsys):
    """``advisor`` alone squashed the whole help page into one ~900-character 'advisor: error: Usage: ...' line.
    A click group given no arguments (no_args_is_help) prints its help on stderr, formatted, and exits 2."""
    code, out, err = run_main([], capsys)
    _, help_page, _ = run_main(["--help"], capsys)
    assert code == 2 and out == "" and err == help_page
    assert err.startswith("Usage: advisor [OPTIONS] COMMAND [ARGS]...\n\n") and "\nCommands:\n" in err
    assert "advisor: error" not in err
    code, _, err = run_main(["nosuchcommand"], capsys)  # a real error stays one line
    assert code == 2 and err == "advisor: error: No such command 'nosuchcommand'. (see advisor --help)\n"


def test_gpus_default_to_this_machine(tmp_path, monkeypatch):
    """Without --gpus, nvidia-smi's list (stubbed here) becomes COUNTxNAME; without a GPU, a clear error."""
    stub = tmp_path / "nvidia-smi"
    stub.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\necho 'NVIDIA H100 80GB HBM3'\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    result = CliRunner().invoke(cli, ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["hardware"]["gpu"], doc["hardware"]["gpus_per_node"]) == ("H100-80GB-SXM", 2)
    stub.unlink()
    result = CliRunner().invoke(cli, ["plan", "--model", "Qwen/Qwen2.5-0.5B"])
    assert result.exit_code == 2 and "no NVIDIA GPU" in result.output


def test_models_lists_each_bundled_id_with_its_size_and_json_agrees():
    """A review: models printed ids only and had no --json, which gpus, inspect, plan and compare have."""
    from advisor.model.bundled import bundled_model_ids

    listed = CliRunner().invoke(cli, ["models"])
    doc = json.loads(CliRunner().invoke(cli, ["models", "--json"]).output)
    assert listed.exit_code == 0 and [row["id"] for row in doc["models"]] == list(bundled_model_ids())
    qwen = next(row for row in doc["models"] if row["id"] == "Qwen/Qwen2.5-7B")
    assert qwen["total_params"] == 7_615_616_512  # the model card's 7.61B
    assert any(line.split() == ["Qwen/Qwen2.5-7B", "7.62B", "qwen2"] for line in listed.output.splitlines())


@pytest.mark.parametrize("global_batch,expected", [(None, 1), (64, 64 // (8 * 2))])
def test_json_accumulation_steps_is_the_step_the_timing_and_exports_assume(global_batch, expected):
    """A review: without --global-batch the JSON's candidates and recommendation said null while their step time and
    every export said 1. Pinned micro-batch 8 on 2 GPUs: one micro-batch a step, else 64 / (8 x 2) = 4."""
    args = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--micro-batch", "8", "--json"]
    args += ["--global-batch", str(global_batch)] if global_batch else []
    doc = json.loads(CliRunner().invoke(cli, args).output)
    fitting = [c for c in doc["candidates"] if c["fits"]]
    assert fitting and doc["recommendation"]["gradient_accumulation_steps"] == expected
    assert {(c["gradient_accumulation_steps"], c["step_time"]["gradient_accumulation_steps"]) for c in fitting} == {
        (expected, expected)}
