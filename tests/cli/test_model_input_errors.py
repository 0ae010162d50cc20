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
    ({"model_type": "no_such_type", "hidden_size": 64}, "does not know model_type 'no_such_type'"),
])
def test_config_transformers_rejects_is_one_line_exit_2(tmp_path, capsys, cfg, expected):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = _run(["inspect", str(tmp_path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0] and len(lines[0]) < 400
