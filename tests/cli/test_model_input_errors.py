"""Bad values inside a config.json reach the user as one line and exit code 2 (issue 10, item 7),
for ``plan --model DIR`` and ``inspect DIR``, on the formula path and the meta-device path."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_CONFIGS
from tests.cli._main import run_main as _run


@pytest.mark.parametrize("family", ["llama_gqa_untied", "gpt_neox_fallback"])  # formula, meta device
@pytest.mark.parametrize("value, shown", [("big", '"big"'), (-64, "-64")])
@pytest.mark.parametrize("command", [["inspect"], ["plan", "--gpus", "1xA100", "--model"]])
def test_bad_config_value_one_line_exit_2(tmp_path, capsys, family, value, shown, command):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_CONFIGS[family], "hidden_size": value}))
    code, out, err = _run([*command, str(tmp_path)], capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert f'"hidden_size" is {shown}; expected a positive integer' in lines[0]


@pytest.mark.parametrize("size, said", [
    ("0B", "MODEL (a size) must be at least 1"),
    ("5", "MODEL (a size) '5' is 5 parameters, below the 20M a size alone can describe"),
])
def test_inspect_names_a_refused_size_as_its_argument(capsys, size, said):
    """inspect takes MODEL, an argument: it said '--model (a size)' and '--params', options it does not have."""
    code, out, err = _run(["inspect", size], capsys)
    assert code == 2 and out == "" and err.startswith(f"advisor: error: {said}") and err.count("\n") == 1
    assert "--model" not in err and "--params" not in err


def test_inspect_size_through_the_one_resolver(capsys):
    code, out, _ = _run(["inspect", "7.5B", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["total_params"] == 7_500_000_000 and "pass a config" in doc["note"]


@pytest.mark.parametrize("cfg, expected", [
    # Keys outside the alias table, checked by transformers' own config validation (meta-device path).
    # state_size is read by the Mamba formula, so advisor.model.config_keys types it before transformers would
    ({"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "state_size": "x"},
     '"state_size" is "x"; expected a positive integer'),
    ({**TINY_CONFIGS["gpt_neox_fallback"], "hidden_size": 65},
     "transformers rejects this gpt_neox config: Class validation error"),
    # and the way forward (a review: it named none)
    ({"model_type": "no_such_type", "hidden_size": 64},
     "does not know model_type 'no_such_type': give its size instead (--params 7B"),
])
def test_config_transformers_rejects_is_one_line_exit_2(tmp_path, capsys, cfg, expected):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = _run(["inspect", str(tmp_path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0] and len(lines[0]) < 400


def test_a_checkpoint_saved_quantised_is_planned_as_its_config_says(tmp_path, capsys):
    """config.json's quantization_config (a fuzz round: ignored, so a 4-bit checkpoint was planned as a full bf16
    fine-tune): bitsandbytes 4-bit is the QLoRA base (nf4, double quantisation as saved) and needs --lora; GPTQ's
    packed layout is not modelled and is refused in one line."""
    import json

    from tests.cli._main import run_main

    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
            "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 32000}
    bnb = tmp_path / "bnb"
    bnb.mkdir()
    (bnb / "config.json").write_text(json.dumps({**base, "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True}}))
    code, out, _ = run_main(["plan", "-m", str(bnb), "-g", "1xA100", "--lora", "16", "--json"], capsys)
    assert code == 0 and (json.loads(out)["training"]["quantize"], json.loads(out)["training"]["double_quant"]) == (
        "nf4", True)
    code, _, err = run_main(["plan", "-m", str(bnb), "-g", "1xA100"], capsys)
    assert code == 2 and err.count("\n") == 1 and "trains only with --lora RANK" in err
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    (gptq / "config.json").write_text(json.dumps({**base, "quantization_config": {"quant_method": "gptq", "bits": 4}}))
    code, _, err = run_main(["plan", "-m", str(gptq), "-g", "1xA100", "--lora", "16"], capsys)
    assert code == 2 and err.count("\n") == 1 and "quantised (gptq" in err
    # a review: the private _load_in_4bit key older BitsAndBytesConfig.to_dict saved is read too
    (bnb / "config.json").write_text(json.dumps({**base, "quantization_config": {
        "quant_method": "bitsandbytes", "_load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}))
    code, out, err = run_main(["plan", "-m", str(bnb), "-g", "1xA100", "--lora", "16", "--json"], capsys)
    assert code == 0 and json.loads(out)["training"]["quantize"] == "nf4", err
    # an fp8 checkpoint (DeepSeek-V3's released config) is the unquantised architecture, said: as the same config
    # without quantization_config plans it (it was refused: a review)
    fp8 = tmp_path / "fp8"
    fp8.mkdir()
    (fp8 / "config.json").write_text(json.dumps({**base, "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(base))
    code, out, err = run_main(["plan", "-m", str(fp8), "-g", "1xA100", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert any("saved in fp8" in line for line in doc["assumptions"])
    code, out, _ = run_main(["plan", "-m", str(plain), "-g", "1xA100", "--json"], capsys)
    assert doc["candidates"] == json.loads(out)["candidates"]


def test_a_config_without_a_width_says_which_default_was_planned(tmp_path, capsys):
    """A local config.json without hidden_size or intermediate_size was built at LlamaConfig's defaults (4096 and
    11008, transformers' configuration_llama.py) without a word (a fuzz round); the assumptions now name the keys and
    the values planned. A complete config has no such line."""
    import json

    from tests.cli._main import run_main

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                   "num_hidden_layers": 4, "num_attention_heads": 8,
                                                   "vocab_size": 32000}))
    code, out, err = run_main(["plan", "-m", str(model), "-g", "1xA100", "--json"], capsys)
    assert code == 0, err
    lines = [line for line in json.loads(out)["assumptions"] if line.startswith("the config gives no")]
    assert lines == ["the config gives no hidden_size, intermediate_size: planned at transformers' defaults for llama "
                     "(hidden_size 4096, intermediate_size 11008); check they are the model's"]
    code, out, _ = run_main(["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "1xA100", "--json"], capsys)
    assert not [line for line in json.loads(out)["assumptions"] if line.startswith("the config gives no")]
