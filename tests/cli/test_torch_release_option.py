"""``--torch-release``: the torch release a run uses, where a release changes what is allocated
(profiles/library_releases.json). FSDP2 reshards its root after forward since torch 2.8 (pytorch#154704), so a
ZeRO-3 plan for 2.7.1 has no second gather of the root at the start of backward (the estimate's backward_start
moment, checked against the simulator in tests/estimate/test_backward_start.py); the plan says which behaviour
it counted; without the option the JSON is as before (no key, no note)."""

from __future__ import annotations

import json

import pytest

from advisor.planning.api import plan
from tests.cli._main import run_main

ARGS = ["plan", "-m", "meta-llama/Llama-3.2-1B", "-g", "8xH100", "--strategy", "zero3", "--json"]


def test_the_release_reaches_the_plan_and_is_said(capsys):
    code, out, err = run_main([*ARGS, "--torch-release", "2.7.1"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["training"]["torch_release"] == "2.7.1"
    assert ("torch 2.7.1 (--torch-release): fsdp2 root reshards after forward: no (since 2.8.0); zero grad sets to "
            "none: yes (since 2.0.0)") in doc["assumptions"]
    code, out, _ = run_main(ARGS, capsys)
    doc = json.loads(out)
    assert "torch_release" not in doc["training"] and not any("--torch-release" in a for a in doc["assumptions"])


def test_before_2_8_the_root_is_not_gathered_again_in_backward():
    """A LoRA step at 128 tokens, whose loss backward is small beside the root: only that moment moves."""
    from advisor.model.lora import LoraConfig

    def moments(release):
        return plan("meta-llama/Llama-3.2-1B", "8xH100", strategy="zero3", torch_release=release, micro_batch_size=1,
                    seq_len=128, lora=LoraConfig(rank=8), activation_checkpointing="on").candidate("zero3").memory_bytes.moments

    older, newest = moments("2.7.1"), moments(None)
    assert older["loss_backward"] < newest["loss_backward"]
    assert {k: v for k, v in older.items() if k != "loss_backward"} == {
        k: v for k, v in newest.items() if k != "loss_backward"}
    assert moments("2.8.0") == newest


@pytest.mark.parametrize("value", ["abc", ""])
def test_a_release_that_is_no_number_is_one_line_and_exit_2(value, capsys):
    code, out, err = run_main([*ARGS, "--torch-release", value], capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert "is not a release number" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("recipe,precision", [("torchtune", "bf16"), ("torchtitan", "bf16-mixed")])
def test_a_stack_that_keeps_its_root_says_so(recipe, precision, capsys):
    """Its plan is the same on every release (no second gather of the head, Recipe.fsdp_root_reshards)."""
    args = [*ARGS, "--recipe", recipe, "--precision", precision]
    code, out, err = run_main([*args, "--torch-release", "2.9.0"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    note = next(a for a in doc["assumptions"] if "--torch-release" in a)
    assert note.endswith(f"(the {recipe} recipe keeps the unit that holds the head unsharded after forward on every "
                         "release)")
    _, older, _ = run_main([*args, "--torch-release", "2.7.1"], capsys)
    assert json.loads(older)["candidates"] == doc["candidates"]
