"""``--task``, ``--num-labels`` and ``--lora-modules-to-save`` on the shared plan options: a task head in
the plan's model, PEFT's saved copy of it trained under LoRA, bad input one line with exit 2."""

from __future__ import annotations

import json

import pytest

from tests.cli._main import run_main


def test_sequence_classification_plan_carries_the_head_and_saves_it_under_lora(capsys):
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "1xRTX4090", "--task",
                               "sequence-classification", "--num-labels", "2", "--lora", "16", "--json"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    head = plan["model"]["head"]
    assert (head["task"], head["num_labels"], head["module"]) == ("sequence-classification", 2, "score")
    # Qwen2.5-7B (7,615,616,512) less its untied lm_head (152,064 x 3584 = 544,997,376) plus score
    # (2 x 3584 = 7,168), plus the rank-16 adapters (5,046,272) and PEFT's copy of score (7,168)
    assert plan["model"]["total_params"] == 7_615_616_512 - 544_997_376 + 7_168 + 5_046_272 + 7_168
    assert plan["model"]["trainable_params"] == 5_046_272 + 7_168
    assert plan["training"]["lora"]["modules_to_save"] == ["score"]
    assert any(note.startswith("task head (--task sequence-classification)") for note in plan["assumptions"])


def test_causal_lm_plan_json_has_no_head_and_no_modules_to_save(capsys):
    code, out, _ = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xA100", "--lora", "8", "--json"],
                            capsys)
    plan = json.loads(out)
    assert code == 0 and "head" not in plan["model"] and "modules_to_save" not in plan["training"]["lora"]


def test_modules_to_save_option_counts_the_copies(capsys):
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xA100", "--lora", "16",
                               "--lora-modules-to-save", "embed_tokens", "--json"], capsys)
    assert code == 0, err
    # 1,081,344 adapters (16 x (1792 + 1024) x 24) + a copy of the 151,936 x 896 embedding
    assert json.loads(out)["model"]["trainable_params"] == 1_081_344 + 136_134_656


@pytest.mark.parametrize("args,message", [
    (("--task", "summarise"), "unknown --task 'summarise'"),
    (("--task", "sequence-classification", "--num-labels", "0"), "--num-labels must be at least 1"),
    (("--num-labels", "3"), "--num-labels needs --task"),
    (("--task", "token-classification", "--loss", "chunked"), "is a causal-LM loss kernel"),
    (("--lora", "8", "--lora-modules-to-save", "classifier"), "no module of Qwen/Qwen2.5-0.5B ends with it"),
    (("--lora", "8", "--lora-modules-to-save", "q_proj"), "is not modelled"),
    (("--lora-modules-to-save", "score"), "need --lora RANK"),
    (("--model", "openai-community/gpt2", "--task", "sequence-classification"), "modelled for the Llama-like"),
])
def test_bad_task_input_is_one_line_and_exit_2(capsys, args, message):
    model = () if "--model" in args else ("--model", "Qwen/Qwen2.5-0.5B")
    code, _, err = run_main(["plan", *model, "--gpus", "1xA100", *args], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and message in err, err


def test_a_pipeline_with_a_task_head_is_refused_in_one_line(capsys):
    """The last stage's loss of a task head under pp is not modelled: --pp is refused, not planned as a vocabulary."""
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--task",
                               "sequence-classification", "--num-labels", "2", "--pp", "2"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "--pp: the last pipeline stage of a sequence-classification head" in err
