"""``--lora RANK --lora-targets --dora`` on the shared plan options: the plan trains the adapters only,
bad input is one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys


def _advisor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "advisor.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_plan_with_lora_trains_the_adapters_only():
    done = _advisor("plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100", "--lora", "16", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    # 16 * ((3584 + 3584) + (3584 + 512)) * 28 layers = 5,046,272 adapter parameters (q_proj, v_proj);
    # Qwen2.5-7B itself has 7,615,616,512 parameters (its model card's 7.61B, counted by transformers).
    assert plan["model"]["trainable_params"] == 5_046_272
    assert plan["model"]["total_params"] == 7_615_616_512 + 5_046_272
    assert any("LoRA rank 16 on q_proj, v_proj" in note for note in plan["assumptions"])


def test_unknown_lora_target_is_one_line_listing_the_linear_layers():
    done = _advisor("plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--lora", "8", "--lora-targets", "attn")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "no linear layer named attn" in done.stderr and "q_proj, k_proj, v_proj, o_proj, gate_proj" in done.stderr


def test_lora_options_need_a_rank_and_a_positive_one():
    for args in (("--dora",), ("--lora-targets", "q_proj"), ("--lora", "0"), ("--lora", "8", "--trainable-params", "1M")):
        done = _advisor("plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", *args)
        assert done.returncode == 2, args
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
