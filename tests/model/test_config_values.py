"""Config values are checked once, where configs are read (issue 10, item 7), through the one alias
table; the one resolver returns the spec and the config it read (the simulator uses it); and
``resolve_model`` accepts a size, as ``--model`` does (item 9a)."""

from __future__ import annotations

import json

import pytest

import advisor
from advisor.model.config_keys import CONFIG_KEYS, check_config, config_value
from advisor.model.sources import resolve, resolve_model
from advisor.simulate.model import ATTENTION_DROPOUT_KEYS, resolve_config, simulation_config
from tests.conftest import TINY_CONFIGS

LLAMA = TINY_CONFIGS["llama_gqa_untied"]


def _write(tmp_path, **changes) -> str:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return str(tmp_path)


@pytest.mark.parametrize("key, value, shown", [
    ("hidden_size", "big", '"big"'),           # was a TypeError inside the formula
    ("hidden_size", -64, "-64"),               # was eight pydantic errors
    ("num_hidden_layers", 2.5, "2.5"),
    ("vocab_size", True, "True"),
    ("num_attention_heads", 0, "0"),
])
def test_bad_value_is_one_error_naming_key_value_and_expectation(tmp_path, key, value, shown):
    with pytest.raises(ValueError) as err:
        resolve_model(_write(tmp_path, **{key: value}))
    message = str(err.value)
    assert f'"{key}" is {shown}; expected a positive integer' in message and "\n" not in message


def test_alias_and_sub_config_values_are_checked():
    gpt2 = {**TINY_CONFIGS["gpt2_mha"], "n_embd": "wide"}
    with pytest.raises(ValueError, match='"n_embd" is "wide"'):
        check_config(gpt2, name="g")
    llava = {"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": -5}}
    with pytest.raises(ValueError, match='"text_config.vocab_size" is -5'):
        check_config(llava, name="l")
    # Zero means "none" for token types and experts; a per-layer list is checked element-wise.
    check_config({"model_type": "x", "type_vocab_size": 0, "num_experts": 0, "intermediate_size": [64, 128]}, name="x")
    with pytest.raises(ValueError, match="intermediate_size"):
        check_config({"model_type": "x", "intermediate_size": [64, "a"]}, name="x")


def test_one_alias_table():
    gpt2 = TINY_CONFIGS["gpt2_mha"]
    assert (config_value(gpt2, "hidden_size"), config_value(gpt2, "num_layers"),
            config_value(gpt2, "num_attention_heads"), config_value(gpt2, "max_position_embeddings")) == (64, 2, 4, 128)
    assert config_value(TINY_CONFIGS["mixtral_moe"], "num_experts") == 4
    # The simulator's attention-dropout keys are the table's, and it zeroes every one of them under SDPA (a GPU's
    # kernels keep no mask); eager attention drops its probabilities out on a GPU too, so the config's stays.
    assert ATTENTION_DROPOUT_KEYS is CONFIG_KEYS["attention_dropout"]
    out = simulation_config({"model_type": "gpt2", "attn_pdrop": 0.1}, attention="sdpa")
    assert all(out[key] == 0.0 for key in CONFIG_KEYS["attention_dropout"])
    bert = {"model_type": "bert", "num_attention_heads": 4, "attention_probs_dropout_prob": 0.1}
    assert simulation_config(bert, attention="eager")["attention_probs_dropout_prob"] == 0.1


def test_one_resolver_returns_spec_and_config(tmp_path):
    path = _write(tmp_path)
    spec, cfg = resolve(path)
    assert cfg == LLAMA and spec.vocab_size == 1000
    assert resolve_config(path) == (path, LLAMA)
    assert resolve_config("Qwen/Qwen2.5-7B")[1] == resolve("Qwen/Qwen2.5-7B").config
    # The simulator's resolution checks values like the planner's (it is the same resolver).
    with pytest.raises(ValueError, match='"hidden_size" is "big"'):
        resolve_config({**LLAMA, "hidden_size": "big"})
    with pytest.raises(ValueError, match="bare size"):
        resolve_config("7.5B")


def test_resolve_model_accepts_a_size():
    spec = advisor.resolve_model("7.5B")
    assert spec.total_params == 7_500_000_000 and spec.source == "params"
    assert resolve_model("350M").total_params == 350_000_000
    assert resolve(" 1.2T ").config is None


def _phi(hidden: int, heads: int, factor: float) -> dict:
    return dict(model_type="phi", architectures=["PhiForCausalLM"], hidden_size=hidden, intermediate_size=4 * hidden,
                num_hidden_layers=2, num_attention_heads=heads, vocab_size=1024, partial_rotary_factor=factor,
                _name_or_path="sweep/phi-h128-l2-v3648")


def test_an_odd_rotary_width_is_refused_in_one_line():
    """The sweep's phi rows 50be143cb286 (head_dim 128 x 0.4 -> 51) and efff7a7491b9 (64 x 0.4 -> 25) failed in
    the simulator with a broadcast error: transformers' PhiAttention rotates int(head_dim x factor) dimensions but
    builds 2 x len(arange(0, width, 2)) cos/sin ones, 52 against 51, so the model fails on one CPU too
    (tests/wrappers/test_losses_fsdp.py's docstring). The planner now says so; even widths (0.5, Phi-2's 80 x 0.4
    = 32) are accepted."""
    with pytest.raises(ValueError) as err:
        advisor.plan(_phi(128, 1, 0.4), "2xH100", trace=False)
    assert str(err.value) == (
        "config for 'sweep/phi-h128-l2-v3648': \"partial_rotary_factor\" is 0.4; expected a share of head_dim 128 "
        "that rotates an even width (int(128 x 0.4) = 51: transformers builds 52 cos/sin dimensions against the 51 "
        "it rotates, and the model's forward fails)")
    with pytest.raises(ValueError, match=r"int\(64 x 0.4\) = 25"):
        check_config(_phi(512, 8, 0.4), name="x")
    for hidden, heads, factor in ((128, 1, 0.5), (2560, 32, 0.4)):
        assert check_config(_phi(hidden, heads, factor), name="x")
    neox = dict(model_type="gpt_neox", hidden_size=64, num_attention_heads=2, rotary_pct=0.25)  # 32 x 0.25 = 8
    assert check_config(neox, name="x") and "rotary_pct" in str(pytest.raises(
        ValueError, check_config, dict(neox, rotary_pct=0.3), name="x").value)  # int(9.6) = 9


def test_an_odd_rotary_width_fails_in_transformers_itself():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.PhiConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=1,
                                    num_key_value_heads=1, vocab_size=64, partial_rotary_factor=0.4)
    model = transformers.PhiForCausalLM(config)
    with pytest.raises(RuntimeError, match="51.*52|52.*51"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))


def test_a_label_count_past_a_classification_head_is_refused_before_transformers_builds_it(tmp_path):
    """num_labels 100,000,000 in a config: transformers' PretrainedConfig builds an id2label entry for each label
    (minutes, gigabytes) before any check of ours ran; the bound is --num-labels' own, 10,000,000."""
    path = _write(tmp_path, architectures=["LlamaForSequenceClassification"], num_labels=100_000_000)
    with pytest.raises(ValueError, match='"num_labels" is 100000000; expected at most 10,000,000'):
        resolve_model(path)
    check_config({**LLAMA, "num_labels": 10_000_000}, name="x")  # the bound itself is a head


@pytest.mark.parametrize("count, label", [(7_615_616_512, "7.62B"), (405 * 10**9, "405B"), (999 * 10**9, "999B"),
                                          (10**12, "1T"), (100 * 10**12, "100T"), (500 * 10**6, "0.5B"),
                                          (999_499 * 10**9, "999T"), (999_500 * 10**9, "1,000T"), (10**15, "1,000T")])
def test_a_size_is_labelled_in_billions_then_trillions(count, label):
    from advisor.model.spec import size_label

    assert size_label(count) == label
