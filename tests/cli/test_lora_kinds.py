"""``--lora 16 --lora-targets X`` on one bundled model of every block kind: a plan (exit 0) or one line
on stderr with exit 2, never an internal error (exit 1) or a traceback; an unknown target lists that
model's own linear layers (the names transformers gives them: tests/model/test_kind_linears.py checks the
listed kinds against the model built on the meta device, tests/model/test_lora.py the Llama-like ones)."""

from __future__ import annotations

import json

import pytest

from advisor.model.bundled import bundled_model_ids, load_architectures
from advisor.model.sources import resolve_model
from tests.cli._main import run_main

# One bundled model per counting formula (profiles/architectures.json), and the Llama-like variants whose
# linear layers differ (Mixtral's experts, Phi-3's fused projections), with that model's linear layers.
KINDS = {
    "meta-llama/Llama-3.1-8B": "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head",
    "mistralai/Mixtral-8x7B-v0.1": "q_proj, k_proj, v_proj, o_proj, lm_head",
    "microsoft/Phi-3-mini-4k-instruct": "qkv_proj, o_proj, gate_up_proj, down_proj, lm_head",
    "openai-community/gpt2": "c_attn, c_proj, c_fc, lm_head",
    "google-bert/bert-base-uncased": "query, key, value, dense, decoder",
    "Qwen/Qwen3-30B-A3B": "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head",
    "deepseek-ai/DeepSeek-V3": "q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, gate_proj, up_proj, "
                               "down_proj, lm_head",
    "google-t5/t5-large": "q, k, v, o, wi, wo, lm_head",
    "facebook/bart-large": "k_proj, v_proj, q_proj, out_proj, fc1, fc2, lm_head",
    "state-spaces/mamba-130m-hf": "in_proj, x_proj, dt_proj, out_proj, lm_head",
    "ai21labs/Jamba-v0.1": "in_proj, x_proj, dt_proj, out_proj, gate_proj, up_proj, down_proj, q_proj, k_proj, "
                           "v_proj, o_proj, lm_head",
    "Qwen/Qwen2.5-VL-7B-Instruct": "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, qkv, proj, "
                                   "mlp.0, mlp.2, lm_head",
    "llava-hf/llava-1.5-7b-hf": "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, out_proj, fc1, fc2, "
                                "linear_1, linear_2, lm_head",
}
TARGETS = [None, "all-linear", "q_proj,v_proj", "no_such_layer", "", "lm_head"]


def _plan(capsys, model: str, targets: str | None) -> tuple[int, str, str]:
    extra = [] if targets is None else ["--lora-targets", targets]
    return run_main(["plan", "--model", model, "--gpus", "8xH100", "--lora", "16", *extra, "--json"], capsys)


def test_every_bundled_kind_has_a_model_here():
    kinds = {load_architectures()[resolve_model(model).model_type].formula for model in bundled_model_ids()}
    assert kinds == {load_architectures()[resolve_model(model).model_type].formula for model in KINDS}


@pytest.mark.parametrize("targets", TARGETS)
@pytest.mark.parametrize("model", list(KINDS))
def test_a_plan_or_one_line_with_exit_2(capsys, model, targets):
    code, out, err = _plan(capsys, model, targets)
    assert code in (0, 2, 3), err  # 3: planned, and nothing fits (DeepSeek-V3 on 8 H100s)
    if code in (0, 3):
        spec = json.loads(out)["model"]
        assert 0 < spec["trainable_params"] < spec["total_params"]
    else:
        assert err.count("\n") == 1 and err.startswith("advisor: error: ") and "internal error" not in err, err


@pytest.mark.parametrize("model", list(KINDS))
def test_an_unknown_target_lists_the_models_own_linear_layers(capsys, model):
    code, _, err = _plan(capsys, model, "no_such_layer")
    assert code == 2
    assert err == (f"advisor: error: no linear layer named no_such_layer in {model}; its linear layers are: "
                   f"{KINDS[model]} (or all-linear)\n")


@pytest.mark.parametrize("model,targets,trainable", [
    # hand-worked: tests/model/test_kind_linears.py (t5-large 144 adapters of 16 x 2048; Jamba 4 attention
    # layers of 16 x (8192 + 5120)); BART large: 12 encoder self-attentions and 12 decoder self- and
    # cross-attentions, q_proj and v_proj 1024 -> 1024 each: 16 x 2048 x (24 + 48) = 2,359,296
    ("google-t5/t5-large", None, 4_718_592),
    ("ai21labs/Jamba-v0.1", "q_proj,v_proj", 851_968),
    ("facebook/bart-large", None, 2_359_296),
])
def test_the_reported_kinds_plan_with_their_adapters(capsys, model, targets, trainable):
    code, out, err = _plan(capsys, model, targets)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["model"]["trainable_params"] == trainable
    if "t5" in model:  # the encoder-decoder activation model counts the frozen base and its adapters
        assert any("a frozen base saves only what input gradients need" in note for note in plan["assumptions"])
        assert not any("an overestimate: adapters on t5" in note for note in plan["assumptions"])


@pytest.mark.parametrize("model,targets,quantized", [
    ("meta-llama/Llama-3.1-8B", "q_proj,v_proj", True), ("openai-community/gpt2", "c_attn", True),
    # their quantised linears are more than block 0's times the layers (two stacks, a vision tower, experts)
    ("google-t5/t5-large", "q,v", False), ("facebook/bart-large", "q_proj,v_proj", False),
    ("llava-hf/llava-1.5-7b-hf", "q_proj,v_proj", False), ("Qwen/Qwen2.5-VL-7B-Instruct", "q_proj,v_proj", False),
    ("ai21labs/Jamba-v0.1", "q_proj,v_proj", False), ("mistralai/Mixtral-8x7B-v0.1", "q_proj,v_proj", False),
])
def test_qlora_is_planned_only_where_every_quantised_linear_is_listed(capsys, model, targets, quantized):
    code, _, err = run_main(["plan", "--model", model, "--gpus", "8xH100", "--lora", "16", "--lora-targets", targets,
                             "--quantize", "nf4", "--json"], capsys)
    if quantized:
        assert code == 0, err
    else:
        assert code == 2 and err == (f"advisor: error: --quantize is modelled for dense decoder and GPT-2 models; "
                                     f"{model} ({resolve_model(model).model_type}) has linear layers this planner "
                                     "does not list\n")


@pytest.mark.parametrize("targets", ["", " , "])
def test_empty_targets_are_refused_not_read_as_the_default(capsys, targets):
    code, _, err = _plan(capsys, "meta-llama/Llama-3.1-8B", targets)
    assert code == 2 and err.startswith("advisor: error: --lora-targets names no module") and err.count("\n") == 1
