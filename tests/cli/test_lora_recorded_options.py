"""``--lora`` on families no formula lists (issue 20, item 3), through the CLI: the adapter counts worked by
hand from the real configs in tests/data/configs (they exited 2, "LoRA counting needs a known architecture",
and --lora-targets gave a KeyError), an unknown target one line with exit 2 listing the model's linear layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli._main import run_main

CONFIGS = Path(__file__).parents[1] / "data" / "configs"

# Rank 16: r x (in + out) per adapted linear, times the blocks.
COUNTS = [
    # phi-2: q_proj, v_proj (2560 -> 2560), fc1 (2560 -> 10240), fc2 (10240 -> 2560); 32 blocks
    ("phi-2", (), 16 * (2 * 5120 + 2 * 12800) * 32),
    # opt-1.3b: q_proj, v_proj (2048 -> 2048); 24 blocks
    ("opt-1.3b", (), 16 * 2 * 4096 * 24),
    # falcon-7b: query_key_value (4544 -> 71 query heads + one key and one value head of 64 = 4672); 32 blocks
    ("falcon-7b", (), 16 * (4544 + 4672) * 32),
    # starcoder2-3b (PEFT has no default): q_proj (3072 -> 3072), v_proj (3072 -> 2 heads x 128); 30 blocks
    ("starcoder2-3b", ("--lora-targets", "q_proj,v_proj"), 16 * (6144 + 3328) * 30),
]


@pytest.mark.parametrize("name,extra,adapters", COUNTS)
def test_lora_16_counts_the_adapters(name, extra, adapters, capsys):
    """--no-trace: the count alone (the linear layers are recorded on the meta device either way)."""
    code, out, err = run_main(["plan", "--model", str(CONFIGS / name), "--gpus", "2xA100", "--lora", "16", *extra,
                               "--no-trace", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["model"]["trainable_params"] == adapters


def test_lora_plan_traces_with_the_adapters(capsys):
    """The full path: counted, then traced with PEFT's adapters (opt-1.3b, out_proj and fc2: 16 x (4096 +
    10240) x 24 = 5,505,024 adapters)."""
    code, out, err = run_main(["plan", "--model", str(CONFIGS / "opt-1.3b"), "--gpus", "2xA100", "--lora", "16",
                               "--lora-targets", "out_proj,fc2", "--strategy", "ddp", "--seq-len", "64",
                               "--json"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["model"]["trainable_params"] == 5_505_024
    assert any("activations traced with PEFT's adapters" in note for note in plan["assumptions"])
    assert any("activations traced on fake tensors" in note for note in plan["assumptions"])


@pytest.mark.parametrize("targets", ["q_proj,query", "all-linear", "self_attn.dense", "lm_head"])
def test_any_linear_name_is_accepted_and_an_unknown_one_exits_2(targets, capsys):
    code, _, err = run_main(["plan", "--model", str(CONFIGS / "phi-2"), "--gpus", "2xA100", "--lora", "16",
                             "--lora-targets", targets, "--no-trace"], capsys)
    if targets != "q_proj,query":
        assert code == 0, err
        return
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no linear layer named query in" in err
    assert "its linear layers are: q_proj, k_proj, v_proj, dense, fc1, fc2, lm_head (or all-linear)" in err


def test_a_family_peft_has_no_default_for_asks_for_targets(capsys):
    code, _, err = run_main(["plan", "--model", str(CONFIGS / "starcoder2-3b"), "--gpus", "2xA100", "--lora", "16",
                             "--no-trace"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert ("PEFT has no default LoRA targets for starcoder2: pass --lora-targets (e.g. all-linear, or some of: "
            "q_proj, k_proj, v_proj, o_proj, c_fc, c_proj, lm_head)") in err
