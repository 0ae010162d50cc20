"""``--activation-offload`` on the command line: the plan moves each block's input to the CPU, says so, and is
refused where it is not modelled. CPU only, no network."""

from __future__ import annotations

import json

import pytest

from tests.cli._main import run_main

# torchtune's Llama 3.2 3B row (README at 1814feb1): one A100, batch 2 of 4096 tokens, bf16, checkpointed,
# compiled, chunked loss, optimizer in backward: the peak is the loss's backward.
JOB = ["-m", "meta-llama/Llama-3.2-3B", "-g", "1xA100-80GB-SXM", "--strategy", "ddp", "--micro-batch", "2",
       "--seq-len", "4096", "--precision", "bf16", "--activation-checkpointing", "on", "--loss", "chunked",
       "--compile", "--optimizer-in-backward"]


def _ddp(capsys, *extra: str) -> tuple[dict, dict]:
    code, out, err = run_main(["plan", *JOB, *extra, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    return doc, next(c for c in doc["candidates"] if c["strategy"] == "ddp")


def test_the_plan_holds_the_block_inputs_in_cpu_memory(capsys):
    plain_doc, plain = _ddp(capsys)
    doc, moved = _ddp(capsys, "--activation-offload")
    assert "activations_on_cpu" not in plain["memory_bytes"]  # plans without the flag read as before
    assert "activation_offload" not in plain_doc["training"]
    assert doc["training"]["activation_offload"] is True
    # 28 blocks x 2 x 4096 x 3072 x 2 bytes (tests/estimate/test_activation_offload.py)
    assert moved["memory_bytes"]["activations_on_cpu"] == 1_409_286_144
    assert plain["memory_bytes"]["peak_allocated"] - moved["memory_bytes"]["peak_allocated"] == 1_409_286_144
    assert moved["step_time"]["step_s"] == plain["step_time"]["step_s"]  # hidden under the compute
    assert moved["step_time"]["offload_s"] > 0 == plain["step_time"]["offload_s"]
    assert any(a.startswith("--activation-offload: torchtune's OffloadActivations") for a in doc["assumptions"])


def test_refused_without_checkpointing_and_never_planned_without_it(capsys):
    """torchtune refuses offloading without checkpointing, and so does the plan: pinned off is exit 2; auto tries
    selective and full only (before, a plan without checkpointing moved every saved tensor over PCIe and ran at
    840 tokens/s where selective checkpointing ran at 15,150: Llama-3.2-1B, 1 x A100 40GB, eager, s 4096)."""
    code, _, err = run_main(["plan", *JOB[:-6], "--activation-checkpointing", "off", "--activation-offload"], capsys)
    assert code == 2 and "planned under activation checkpointing" in err
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.2-1B", "-g", "1xA100-40GB", "--seq-len", "4096",
                               "--attention", "eager", "--strategy", "ddp", "--activation-offload", "--json"], capsys)
    assert code == 0, err
    ddp = json.loads(out)["candidates"][0]
    assert ddp["activation_checkpointing"] and ddp["step_time"]["tokens_per_s"] > 10_000


def test_refused_on_a_mesh_and_on_deepspeed(capsys):
    code, _, err = run_main(["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--tp", "2",
                             "--activation-offload"], capsys)
    assert code == 2 and "--activation-offload is modelled for data parallelism on one mesh dimension" in err
    code, _, err = run_main(["plan", *JOB, "--activation-offload", "--engine", "deepspeed"], capsys)
    assert code == 2 and "--activation-offload is modelled on the torch engine" in err


# Llama-3.1-8B on 2 x A100 40GB at 32,768 tokens, fused loss and AdamW: nothing fits on the GPUs alone.
LONG = ["-m", "meta-llama/Llama-3.1-8B", "-g", "2xA100-40GB", "--seq-len", "32768", "--loss", "fused",
        "--optimizer-impl", "fused"]


def test_a_remedy_that_keeps_the_mathematics_and_is_the_plan_it_names(capsys):
    """Offloading the block inputs lets the offloading plan take a larger micro-batch: the remedy's tokens/s
    are the plan's with the flag, and it ranks among the remedies that keep the mathematics."""
    code, out, _ = run_main(["plan", *LONG, "--json"], capsys)
    remedies = json.loads(out)["recommendation"]["remedies"]
    remedy = next(r for r in remedies if r["name"] == "--activation-offload")
    assert remedy["keeps_math"] and remedy["saved_gib"] > 0
    code, out, _ = run_main(["plan", *LONG, "--activation-offload", "--json"], capsys)
    planned = json.loads(out)
    chosen = next(c for c in planned["candidates"] if c["strategy"] == planned["recommendation"]["strategy"]
                  and c["mesh"] is None)
    assert remedy["tokens_per_s"] == pytest.approx(chosen["step_time"]["tokens_per_s"])
    assert remedy["strategy"] == chosen["strategy"]


def test_no_remedy_where_the_peak_holds_no_activation(capsys):
    """The README's first command: zero3's peak is the foreach optimizer step, where no activation is saved."""
    code, out, _ = run_main(["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--json"], capsys)
    names = [r["name"] for r in json.loads(out)["recommendation"]["remedies"]]
    assert "--optimizer-impl fused" in names and "--activation-offload" not in names


def test_trl_sft_config_activation_offloading_is_read(tmp_path, capsys):
    """TRL's SFTConfig (a TrainingArguments with its own keys, trl/trainer/sft_config.py) saved as JSON:
    ``activation_offloading`` plans --activation-offload and says where it came from."""
    path = tmp_path / "sft_config.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "gradient_checkpointing": True,
                                "activation_offloading": True}))
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.2-3B", "-g", "1xA100-80GB-SXM", "--seq-len",
                               "4096", "--from", str(path), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["training"]["activation_offload"] is True and doc["training"]["recipe"] == "trainer"
    chosen = next(c for c in doc["candidates"] if c["strategy"] == doc["recommendation"]["strategy"])
    # checkpointed: the 28 blocks' inputs, the fp32 residual stream of bf16 autocast over fp32 weights (the file's
    # bf16 on one GPU): 28 x 2 x 4096 x 3072 x 4 bytes
    assert chosen["memory_bytes"]["activations_on_cpu"] == 28 * 2 * 4096 * 3072 * 4 == 2_818_572_288
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.2-3B", "-g", "1xA100-80GB-SXM", "--seq-len",
                               "4096", "--from", str(path)], capsys)
    assert "activation_offloading" in out + err


def test_the_exports_say_how_to_run_it(capsys):
    """No launcher or Trainer config key carries it: the export says which call does."""
    code, out, err = run_main(["export", "-m", "meta-llama/Llama-3.2-3B", "-g", "1xA100-80GB-SXM", "--activation-offload",
                               "--format", "trainer-args", "-o", "-"], capsys)
    assert code == 0, err
    assert "SFTConfig(activation_offloading=True)" in err and "wrap(model, activation_offload=True)" in err
    assert "activation_offloading" not in out  # TrainingArguments(**file) has no such key


def test_a_check_across_options_is_its_own_message(capsys):
    """A refusal that names two options is printed as written, not as 'value: Value error, ... (got {...})'."""
    code, _, err = run_main(["plan", *JOB[:-6], "--activation-checkpointing", "off", "--activation-offload"], capsys)
    assert code == 2 and err.startswith("advisor: error: --activation-offload is planned under activation checkpointing")
    assert "Value error" not in err and "(got {" not in err


def test_the_reason_says_why_checkpointing_is_on(capsys):
    """Under the flag checkpointing is on because offloading runs under it, not because nothing fits without it."""
    args = ["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "1xRTX4090", "--lora", "16", "--seq-len", "8192",
            "--loss", "fused"]
    code, out, _ = run_main([*args, "--activation-offload", "--json"], capsys)
    reasons = [r for r in json.loads(out)["reasons"] if r["kind"] == "checkpointing-on"]
    assert reasons and reasons[0]["offload"] is True
    code, out, _ = run_main([*args, "--activation-offload", "--verbose"], capsys)
    assert "--activation-offload runs under it" in " ".join(out.split())
    code, out, _ = run_main([*args, "--json"], capsys)
    assert all("offload" not in r for r in json.loads(out)["reasons"] if r["kind"] == "checkpointing-on")


def test_trl_offloading_where_not_modelled_is_planned_without_it_and_said(tmp_path, capsys):
    """A saved SFTConfig with activation_offloading and gradient checkpointing turned off (TRL's default is on): the
    plan is made without it, with a note naming the key, instead of refusing the whole file."""
    path = tmp_path / "sft_config.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "activation_offloading": True,
                                "gradient_checkpointing": False}))
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.2-3B", "-g", "1xA100-80GB-SXM", "--from", str(path),
                               "--json"], capsys)
    assert code == 0, err
    assert "activation_offload" not in json.loads(out)["training"]
    code, out, err = run_main(["plan", "-m", "meta-llama/Llama-3.2-3B", "-g", "1xA100-80GB-SXM", "--from",
                               str(path)], capsys)
    assert "activation_offloading is planned under gradient checkpointing" in " ".join((out + err).split())
