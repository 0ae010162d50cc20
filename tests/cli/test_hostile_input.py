"""Hostile input found by issue 21 (items 8, 16 and 18): each ends as one line on stderr with exit
code 2 (the user's input), 3 (nothing fits) or 1 (a bug of ours), never a traceback or a hang."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from advisor.model.bundled import load_bundled_config
from tests.cli._main import run_main
from tests.conftest import TINY_CONFIGS

LLAMA = TINY_CONFIGS["llama_gqa_untied"]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _plan_config(tmp_path, capsys, cfg: dict, *extra: str) -> tuple[int, str]:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_main(["plan", "-m", str(tmp_path), "-g", "2xA100", *extra], capsys)
    return code, err


@pytest.mark.parametrize("change, expected", [
    ({"hidden_size": [2048]}, '"hidden_size" is [2048]; expected a positive integer'),
    ({"model_type": ["llama"]}, '"model_type" is [\'llama\']; expected a string'),
    ({"num_hidden_layers": 10**6}, "at most 10,000 blocks"),
    ({"num_hidden_layers": 10**9}, "at most 10,000 blocks"),
    ({"tie_word_embeddings": "false"}, '"tie_word_embeddings" is "false"; expected true or false'),
    ({"attention_bias": "false"}, '"attention_bias" is "false"; expected true or false'),
    ({"architectures": "LlamaForCausalLM"}, "expected a list of class names"),
])
def test_a_wrongly_typed_config_value_is_refused(tmp_path, capsys, change, expected):
    code, err = _plan_config(tmp_path, capsys, {**LLAMA, **change})
    assert code == 2 and expected in _one_line(err)


def test_a_class_that_is_not_a_model_is_refused(tmp_path, capsys):
    cfg = {**TINY_CONFIGS["gpt_neox_fallback"], "architectures": ["Trainer"]}  # the meta-device path
    code, err = _plan_config(tmp_path, capsys, cfg)
    assert code == 2 and "names Trainer, which is not a transformers model class" in _one_line(err)


def test_deepseek_qk_rope_head_dim_true_is_refused(tmp_path, capsys):
    cfg = {**load_bundled_config("deepseek-ai/DeepSeek-V3"), "qk_rope_head_dim": True}
    code, err = _plan_config(tmp_path, capsys, cfg)
    assert code == 2 and '"qk_rope_head_dim" is True; expected a whole number' in _one_line(err)


def test_a_negative_vision_width_is_refused(tmp_path, capsys):
    cfg = load_bundled_config("Qwen/Qwen2.5-VL-7B-Instruct")
    cfg = {**cfg, "vision_config": {**cfg["vision_config"], "out_hidden_size": -3584}}
    code, err = _plan_config(tmp_path, capsys, cfg)
    assert code == 2 and '"vision_config.out_hidden_size" is -3584; expected a positive integer' in _one_line(err)


def test_a_file_that_is_not_json_is_named_as_such(tmp_path, capsys):
    """A text file passed as the model (say /etc/passwd): one line that says it is not a JSON config."""
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    code, _, err = run_main(["plan", "-m", str(tmp_path / "passwd"), "-g", "2xA100"], capsys)
    assert code == 2 and "not a JSON config.json (Expecting value at line 1)" in _one_line(err)


def test_json_nested_100k_deep_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run_main(["plan", "-m", str(tmp_path), "-g", "2xA100"], capsys)
    assert code == 2 and "nested too deeply" in _one_line(err)


@pytest.mark.parametrize("args, expected", [
    (["--cpu-memory-gib", "inf"], "--cpu-memory-gib"),
    (["--headroom", "nan"], "not a finite number"),
    (["--params", "1" + "0" * 400], "more than 1e+15 parameters"),
    (["-m", "~nouser/x"], "cannot load model '~nouser/x'"),
])
def test_hostile_options_are_one_line(capsys, args, expected):
    base = ["plan", "-g", "2xA100"] + ([] if args[0] in ("-m", "--params") else ["-m", "Qwen/Qwen2.5-0.5B"])
    code, _, err = run_main(base + args, capsys)
    assert code == 2 and expected in _one_line(err)


def test_torchtitan_70b_preset_plans_without_a_traceback(capsys):
    """Data parallelism alone is blocked (64 is not a multiple of micro-batch 8 x 64 GPUs) and only the
    pinned mesh is left; the loss-kernel note used to ask the planner about the empty DP list."""
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.1-70B", "-g", "8x8xA100", "--seq-len", "8192",
                               "--global-batch", "64", "--strategy", "zero3", "--tp", "8", "--micro-batch", "8",
                               "--activation-checkpointing", "on"], capsys)
    # The closest mesh is named (with pipeline stages searched too, pp 8 x tp 8 holds less than dp_shard 8 x tp 8).
    assert code in (0, 3) and "Traceback" not in err and "No mesh with the pinned degrees fits" in out
    assert "x tp 8, needs" in " ".join(out.split())  # the line wraps at the terminal's width


def test_an_internal_validation_error_is_exit_1_not_bad_input(capsys, monkeypatch):
    """A pydantic error from inside the library is our bug: exit 1 and a short report, not exit 2."""
    import advisor.planning.api as api
    from advisor.training import TrainingConfig

    def broken(*args, **kwargs):
        return TrainingConfig.model_validate({"seq_len": -1})

    monkeypatch.setattr(api, "resolve", broken)
    code, _, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100"], capsys)
    line = _one_line(err)
    assert code == 1 and "internal error (ValidationError" in line and "test_hostile_input.py" not in line


def test_a_bad_option_value_is_still_exit_2_through_the_library(capsys):
    from advisor.planning.api import plan

    with pytest.raises(ValueError, match=r"^seq_len \(--seq-len\): Input should be greater than or equal to 1 "
                                         r"\(got 0\)"):
        plan("Qwen/Qwen2.5-0.5B", gpus="2xA100", seq_len=0)
    # a review: the library named its keywords as the command line does ('micro-batch-size', a flag that is not one)
    for keywords, named in ((dict(micro_batch_size=0), "micro_batch_size (--micro-batch): "),
                            (dict(hybrid=0), "hybrid (--hybrid): "),
                            (dict(activation_checkpointing="maybe"),
                             "activation_checkpointing (--activation-checkpointing): ")):
        with pytest.raises(ValueError) as err:
            plan("Qwen/Qwen2.5-0.5B", gpus="2xA100", **keywords)
        assert str(err.value).startswith(named), str(err.value)


def test_ctrl_c_during_start_up_is_one_line_and_exit_130():
    """The installed script's entry imports the command inside its handler (advisor.cli.entry)."""
    script = ("import builtins\nreal = builtins.__import__\n"
              "def interrupted(name, *args, **kwargs):\n"
              "    if name == 'advisor.cli.main':\n        raise KeyboardInterrupt\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = interrupted\n"
              "from advisor.cli.entry import console\nconsole()\n")
    done = subprocess.run([sys.executable, "-c", script, "plan"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and done.stderr == "advisor: interrupted\n"


def test_ctrl_c_while_a_command_runs_is_one_line_and_exit_130(capsys, monkeypatch):
    import advisor.planning.api as api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "resolve", interrupted)
    code, _, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100"], capsys)
    assert code == 130 and _one_line(err) == "advisor: error: interrupted"


def test_export_to_an_empty_name_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["export", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "-o", ""], capsys)
    assert code == 2 and "empty" in _one_line(err) and list(tmp_path.iterdir()) == []
    code, _, err = run_main(["export", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "-o", "newdir/"], capsys)
    assert code == 2 and "names a directory" in _one_line(err) and list(tmp_path.iterdir()) == []


def test_t5_with_no_layers_is_refused(tmp_path, capsys):
    """Found by the plan-level fuzz: T5 spells its depth ``num_layers``; 0 reached the meta device and a
    ModelSpec that cannot hold it (exit 1)."""
    cfg = {**load_bundled_config("google-t5/t5-large"), "num_layers": 0}
    code, err = _plan_config(tmp_path, capsys, cfg)
    assert code == 2 and '"num_layers" is 0; expected a positive integer' in _one_line(err)


def test_seq_len_max_keeps_the_micro_batch_asked_for():
    """``--seq-len max --micro-batch 4`` planned micro-batch 1 without a word (issue 21, item 10)."""
    from advisor.planning.api import plan

    one = plan("Qwen/Qwen2.5-7B", gpus="8xH100", seq_len="max")
    four = plan("Qwen/Qwen2.5-7B", gpus="8xH100", seq_len="max", micro_batch_size=4)
    assert four.training.micro_batch_size == 4 and four.recommendation.micro_batch_size == 4
    assert four.training.seq_len < one.training.seq_len
    assert any("fits at micro-batch 4" in note for note in four.assumptions)


def test_seq_len_max_where_no_length_fits_exits_3_as_nothing_fits(tmp_path, capsys):
    """405B parameters on one 16 GB T4 with 16 GiB of CPU memory: without --seq-len max nothing fits (exit 3); with it
    the length search's "not even one token fits" was exit 2, the code of bad input. Through --from too."""
    job = ["plan", "-m", "meta-llama/Llama-3.1-405B", "-g", "1xT4", "--cpu-memory-gib", "16"]
    code, _, _ = run_main(job, capsys)
    assert code == 3
    (tmp_path / "z3.json").write_text('{"zero_optimization": {"stage": 3}}')
    for extra in ([], ["--from", str(tmp_path / "z3.json")]):
        code, out, err = run_main([*job, "--seq-len", "max", *extra], capsys)
        assert code == 3 and not out
        assert _one_line(err) == ("advisor: error: not even one token fits on these GPUs at micro-batch 1; see advisor "
                                  "plan without --seq-len max")


def test_tp_help_does_not_promise_sequence_parallelism(capsys):
    """The TP the planner models and wrap() applies keeps norms and block inputs whole (wrappers/tensor_parallel.py)."""
    code, out, _ = run_main(["plan", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "(with sequence parallelism)" not in text and "no sequence parallelism" in text


@pytest.mark.parametrize("args, code_expected, expected", [
    # A fuzz run of this stop (random flag combinations through main()): three internal errors (exit 1).
    # --virtual-stages without an interleaved schedule under --seq-len max: the pinned pipeline meshes were built
    # before the pins were checked (ParallelDims refused one); now the pins' own error, as without --seq-len max.
    (["-m", "Qwen/Qwen2.5-7B", "-g", "8xA100-40GB", "--virtual-stages", "2", "--seq-len", "max"], 2,
     "virtual stages 2 need an interleaved schedule"),
    # Gemma 2's sandwich norm on a TP 4 rank frees more of the recomputed block than its quarter of the MLP's
    # gradients take: the block's backward point had a negative temporary (MemoryBreakdown refused it).
    (["-m", "google/gemma-2-2b", "-g", "8xV100-32GB", "--task", "sequence-classification", "--seq-len", "131072",
      "--tp", "4"], 0, "Recommendation: zero3 (torch) on mesh cp 2 x tp 4"),
    # The LoRA remedy of a --float8 plan that offloads: --lora is refused with --float8, and the remedy search
    # built that config anyway; such a remedy is left out now.
    (["-m", "Qwen/Qwen2.5-7B", "-g", "1xRTX4090", "--float8"], 0, "Recommendation: zero3_offload"),
    # --virtual-stages / --pp-schedule without --pp on an MoE model: the pipeline search also listed expert-only
    # meshes (pp 1), and gave them the pinned virtual stages (ParallelDims refused '1f1b' with 2); a pinned schedule
    # or virtual stages now asks for pipelines only.
    (["-m", "Qwen/Qwen3-30B-A3B", "-g", "8xH100", "--virtual-stages", "2", "--pp-schedule", "zbv"], 3,
     "No mesh with --pp-schedule zbv --virtual-stages 2 fits"),
])
def test_fuzz_findings_end_as_a_plan_or_one_line(capsys, args, code_expected, expected):
    code, out, err = run_main(["plan", *args], capsys)
    assert code == code_expected and "Traceback" not in err and "internal error" not in err
    assert expected in (" ".join(out.split()) if code in (0, 3) else _one_line(err))


def test_cpu_export_refuses_a_length_search_in_words(capsys):
    """export --cpu --seq-len max: the CPU test config plans no GPU, so there is no memory to search; it printed
    pydantic's 'seq-len: Input should be a valid integer ... (got 'max')'."""
    code, _, err = run_main(["export", "-m", "Qwen/Qwen2.5-0.5B", "--cpu", "--seq-len", "max", "-o", "-"], capsys)
    assert code == 2 and "--seq-len max searches the GPUs' memory" in _one_line(err)


def test_helper_fuzz_findings_are_one_line(tmp_path, capsys):
    """A second fuzz run (a helper's, about 65,000 calls): two internal errors, a 600-character message, a file name
    the user never gave and a progress bar before a refusal."""
    # A torchtitan TOML whose 'training' is not a table: TypeError at the batch key's lookup (exit 1).
    (tmp_path / "t.toml").write_text("training = 3\n")
    code, _, err = run_main(["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "8xH100", "--from", str(tmp_path / "t.toml")],
                            capsys)
    assert code == 2 and "training must be a mapping of keys, got 3" in _one_line(err)
    # --trust-remote-code on a local config transformers rejects: huggingface_hub's validation error escaped (exit 1),
    # and an unknown model_type printed transformers' own paragraph; now the messages the flag's absence gives.
    base = dict(architectures=["LlamaForCausalLM"], hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=1000)
    for name, cfg, expected in (("m1", dict(base, model_type="llama", intermediate_size=None),
                                 "transformers rejects this llama config"),
                                ("m2", dict(base, model_type="zzzz"), "does not know model_type 'zzzz'")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        code, _, err = run_main(["plan", "-m", str(tmp_path / name), "-g", "2xA100", "--trust-remote-code"], capsys)
        assert code == 2 and expected in _one_line(err) and len(err) < 400, err
    # A directory that takes no new file: the error named the hidden temporary file written beside the target.
    code, _, err = run_main(["export", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "-o", "/proc/x.yaml"], capsys)
    assert code == 2 and _one_line(err).startswith("advisor: error: cannot write /proc/x.yaml:") and ".tmp" not in err
    # simulate on a size alone: refused before the progress bar starts, so one line.
    code, _, err = run_main(["simulate", "--params", "7B", "--gpus", "1xA100", "--seq-len", "128"], capsys)
    assert code == 2 and "simulate needs a model config" in _one_line(err)


@pytest.mark.parametrize("extra, expected", [
    # fixed per-GPU costs at or past the card: their own reason, not "one sample's activations"
    (("-m", "Qwen/Qwen2.5-0.5B", "--reserve-gib", "80"),
     "--reserve-gib 80 and the CUDA context (1 GiB) take 81.00 GiB of the A100-80GB-SXM's 79.15 GiB before any "
     "tensor: no plan can fit"),
    # a CPU rate so small the offloaded step never ends: refused at the option (it reached StepTime's validation)
    (("-m", "Qwen/Qwen2.5-7B", "--cpu-step-rate", "1e-300"), "1e-300 is not in the range 1000.0<=x<=1e13"),
    # a size typed as --model is named as typed
    (("-m", "0B"), "--model (a size) must be at least 1"),
    # 5 parameters planned as a Llama-like shape with a 32,000-token vocabulary (46.9 GiB of logits; a review)
    (("-m", "5"), "--model (a size) '5' is 5 parameters, below the 20M a size alone can describe"),
    # the flag as typed, not the field (it said 'micro-batch-size: Input should be ...')
    (("-m", "Qwen/Qwen2.5-0.5B", "--micro-batch", "99999999"), "--micro-batch: must be 1 to 65,536, got 99999999"),
    # all-linear among names: refused as such (it said 'no linear layer named all-linear ... (or all-linear)')
    (("-m", "Qwen/Qwen2.5-0.5B", "--lora", "16", "--lora-targets", "all-linear,q_proj"),
     "--lora-targets: all-linear stands alone"),
])
def test_overheads_rates_and_sizes_are_said_as_given(capsys, extra, expected):
    code, _, err = run_main(["plan", "-g", "2xA100", *extra], capsys)
    assert code == 2
    assert expected in _one_line(err).replace("10000000000000.0", "1e13")


def test_a_reserve_just_under_the_card_is_named_as_the_reason(capsys):
    """--reserve-gib 78 of an 80 GB A100 (79.15 GiB) with its 1 GiB CUDA context leaves 0.15 GiB: nothing fits,
    and the answer names the reserve (the smallest plan needs some GiB of its own), not the activations alone."""
    code, out, err = run_main(["plan", "-g", "2xA100", "-m", "Qwen/Qwen2.5-0.5B", "--reserve-gib", "78"], capsys)
    assert code == 3 and "Traceback" not in err
    head = " ".join(out.split("\n\n")[0].split())
    assert "exceed the 0.2 GiB of a GPU that --reserve-gib 78 and the CUDA context leave" in head, head
    assert "lower --reserve-gib or shorten --seq-len" in head, head


@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize("switch", ["on", "off"])
def test_the_exports_hybrid_switch_is_refused_where_nothing_is_exported(capsys, command, switch):
    """--hybrid on|off checks what an export writes; plan and compare took it and planned as if it was not given."""
    code, out, err = run_main([command, "-m", "Qwen/Qwen2.5-0.5B", "-g", "8xH100", "--hybrid", switch], capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert f"--hybrid {switch} checks the plan an export writes (advisor export); to plan replicas give --hybrid N" in err


@pytest.mark.parametrize("as_json", [False, True])
def test_compare_where_no_cluster_fits_exits_3_as_plan_does(capsys, as_json):
    """100T parameters on 2 x A100 and 8 x H100: every row 'does not fit' and exit 0 before; the title read
    '1e+05B parameters: 1e+05B parameters'."""
    code, out, err = run_main(["compare", "--params", "100T", "--gpus", "2xA100,8xH100", *(["--json"] if as_json else [])],
                              capsys)
    assert code == 3 and "Traceback" not in err
    if as_json:
        doc = json.loads(out)
        assert doc["fastest"] is None and not any(r["fits"] for r in doc["results"])
    else:
        assert out.split("\n")[0].strip() == "100T parameters"


def test_sizes_from_a_thousand_billion_up_are_written_without_an_exponent(capsys):
    """--params 1T -v gave the size default as '1e+03B parameters (> 10B)'; --params 10**15 named the model
    '1e+03T parameters'. size_label writes them (1T, 1,000T), 405B as before."""
    for size, label in (("1T", "1T"), ("1000000000000000", "1,000T"), ("405B", "405B")):
        code, out, err = run_main(["plan", "--params", size, "-g", "2xA100", "--json"], capsys)
        doc = json.loads(out)
        assert code in (0, 3) and doc["model"]["name"] == f"{label} parameters", err
        assert f"Default from size: zero3 ({label} parameters (> 10B): full sharding, CPU offload considered)." \
            in doc["why"] + doc["assumptions"]
        assert re.search(r"e\+\d+[BT] parameters", out) is None
    code, out, _ = run_main(["plan", "--params", "1T", "-g", "2xA100", "--precision", "bf16", "-v"], capsys)
    assert code in (0, 3) and "Default from size: zero3 (1T parameters (> 10B)" in " ".join(out.split())
    assert re.search(r"e\+\d+[BT] parameters", out) is None


def test_nothing_to_train_is_refused(capsys):
    """A fuzz round: --trainable-params 0% was planned as a ddp training step (0 was refused), and a live model with
    every parameter frozen got a plan whose wrap() then failed inside torch's DDP."""
    from tests.cli._main import run_main

    for share in ("0%", "0.0000001%"):
        code, out, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", f"--trainable-params={share}"],
                                  capsys)
        assert code == 2 and not out and err.count("\n") == 1 and "nothing trains" in err, err
    import advisor
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="nothing trains: every parameter of the model is frozen"):
        advisor.plan(model, "2xA100")


def test_export_and_launch_exit_3_when_nothing_fits(tmp_path, capsys):
    """README: exit code 3 is 'nothing fits'; export and launch said it with 2 (a fuzz round)."""
    from tests.cli._main import run_main

    job = ["-m", "meta-llama/Llama-3.1-70B", "-g", "8xH100", "--strategy", "ddp"]
    code, _, err = run_main(["export", *job, "-o", str(tmp_path / "a.yaml")], capsys)
    assert code == 3 and "nothing to export" in err and not (tmp_path / "a.yaml").exists()
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, _, err = run_main(["launch", *job, "--dry-run", "--config-file", str(tmp_path / "l.yaml"), str(script)],
                            capsys)
    assert code == 3 and "ddp does not fit" in err


def test_an_absurd_global_batch_or_accumulation_is_one_line_and_exit_2(tmp_path, capsys):
    """A fuzz round: 10^12 accumulation steps in a TrainingArguments file planned a 4.5 x 10^11-second step. The global
    batch is bounded at 2^24 samples (a thousand times Llama 3 405B's 2,048 samples of 8,192 tokens a step), on the
    command line, in a file's keys, and where a file's accumulation x micro-batch x GPUs makes it."""
    from advisor.training import MAX_GLOBAL_BATCH

    assert MAX_GLOBAL_BATCH == 16_777_216
    path = tmp_path / "args.json"
    cases = [([], "--global-batch", str(2**24 + 1), "is not in the range 1<=x<=16777216"),
             (["--from", str(path)], None, 10**12, "gradient_accumulation_steps must be at most 16,777,216"),
             (["--from", str(path)], None, 2**21, "is 33,554,432 samples a step, above --global-batch's bound 16,777,216")]
    for extra, flag, value, said in cases:
        path.write_text(json.dumps({"gradient_accumulation_steps": value, "per_device_train_batch_size": 2}))
        args = ["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "8xH100", *extra, *([flag, value] if flag else [])]
        code, out, err = run_main(args, capsys)
        assert code == 2 and not out and err.count("\n") == 1 and said in err, err
    code, out, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "8xH100", "--global-batch", str(2**24)], capsys)
    assert code == 0 and err == ""


@pytest.mark.parametrize("name", ["-", ""])
def test_launch_refuses_a_config_file_it_cannot_hand_to_accelerate(tmp_path, monkeypatch, capsys, name):
    """``advisor launch --config-file -`` wrote a file named '-' (the review of issue 19): accelerate reads the
    config from a file, so '-' and an empty name are refused in one line, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    code, _, err = run_main(["launch", "-m", "Qwen/Qwen2.5-0.5B", "--cpu", "--processes", "1", "--config-file", name,
                             "train.py"], capsys)
    assert code == 2 and "advisor export -o - prints the config" in _one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_an_empty_gpus_is_said_empty_not_missing(capsys):
    """``--gpus ''`` said "no --gpus given" (the review of issue 19): one was given, and it was empty."""
    code, _, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "--gpus", ""], capsys)
    assert code == 2 and "--gpus is empty" in _one_line(err)
