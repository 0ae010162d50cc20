"""``advisor plan --from`` on axolotl's own YAML (``axolotl train config.yml``): its keys read into the knobs they fix,
checked against the published jobs panel, whose rows for these two examples were read off the same files by hand
(profiles/published_jobs.json), and against axolotl's schema defaults (axolotl-ai-cloud/axolotl@067b021,
src/axolotl/utils/schemas/) for what a file leaves out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.planning.config_formats import read_config_file
from tests.cli._main import run_main

CONFIGS = Path(__file__).parent / "configs"
PANEL = {job["id"]: job for job in json.loads((Path(__file__).parents[2] / "profiles" / "published_jobs.json")
                                             .read_text())["jobs"]}


@pytest.mark.parametrize("name,job", [("axolotl_llama2_qlora.yml", "axolotl-llama2-7b-qlora-4090"),
                                      ("axolotl_llama3_fft_8b.yaml", "axolotl-llama3-8b-fft-48gb"),
                                      ("axolotl_llama3_qlora_fsdp_70b.yaml",
                                       "axolotl-llama3-70b-qlora-fsdp-offload-2gpu")])
def test_the_example_reads_as_the_panel_row_written_from_it(name, job):
    config, row = read_config_file(CONFIGS / name), PANEL[job]
    settings = config.settings
    assert config.format == "axolotl" and settings["recipe"] == row["recipe"] == "trainer"
    assert (settings["micro_batch"], settings["seq_len"], settings["precision"], settings["optimizer"]) == (
        row["micro_batch_size"], row["seq_len"], row["precision"], row["optimizer"])
    gpus = int(row["gpus"].split("x")[0])  # "2xRTX4090"
    assert settings["micro_batch"] * settings["gradient_accumulation"] * gpus == row["global_batch_size"]
    assert settings["activation_checkpointing"] == row["activation_checkpointing"] == "on"
    if row["optimizer_impl"]:
        assert settings["optimizer_impl"] == row["optimizer_impl"]
    assert (settings["strategy"], settings["engine"]) == (row["strategy"], row["engine"])
    if row.get("fsdp_version"):  # FSDP through the Trainer: the version the row ran
        assert settings["fsdp_version"] == row["fsdp_version"]
    lora = row["lora"]
    if lora is None:
        assert "lora_rank" not in settings and "quantize" not in settings
    else:
        assert (settings["lora_rank"], settings["lora_targets"], float(settings["lora_dropout"])) == (
            lora["rank"], lora["targets"], lora["dropout"])
        assert (settings["quantize"], bool(settings["double_quant"])) == (row["quantize"], row["double_quant"])


def _read(tmp_path: Path, text: str):
    path = tmp_path / "config.yml"
    path.write_text(text)
    return read_config_file(path)


def test_what_a_file_leaves_out_runs_at_axolotls_defaults(tmp_path):
    """micro_batch_size 1, sequence_len 512, gradient_checkpointing false, optimizer adamw_torch_fused, bf16 auto
    (a LoRA: bf16-mixed, the adapters fp32 beside the bf16 base), lora_dropout 0.0 (nothing to take)."""
    config = _read(tmp_path, "base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nlora_r: 8\n")
    assert config.settings == {"model": "Qwen/Qwen2.5-0.5B", "lora_rank": 8, "micro_batch": 1, "seq_len": 512,
                               "precision": "bf16-mixed", "optimizer": "adamw", "optimizer_impl": "fused",
                               "activation_checkpointing": "off", "engine": "torch", "strategy": "ddp",
                               "recipe": "trainer"}


def test_a_deepspeed_config_sets_the_engine_and_keeps_fp32_master_weights(tmp_path):
    config = _read(tmp_path, "base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 2048\n"
                             "deepspeed: {zero_optimization: {stage: 3}, bf16: {enabled: auto}}\n")
    assert (config.settings["engine"], config.settings["strategy"], config.settings["precision"]) == (
        "deepspeed", "zero3", "bf16-mixed")


@pytest.mark.parametrize("fsdp,strategy", [
    ("fsdp_version: 2\nfsdp_config: {activation_checkpointing: true}", "zero3"),
    ("fsdp_config: {fsdp_version: 2, reshard_after_forward: false}", "zero2"),
    ("fsdp_version: 2\nfsdp_config: {offload_params: true}", "zero3_offload")])
def test_axolotls_own_fsdp_config_sets_the_strategy(tmp_path, fsdp, strategy):
    """axolotl's FSDPConfig (schemas/fsdp.py) with no Trainer fsdp words: full sharding unless reshard_after_forward
    is false, offload_params the offload, its activation_checkpointing FSDP's own (full, per block)."""
    settings = _read(tmp_path, f"base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 512\n{fsdp}\n").settings
    assert (settings["strategy"], settings["engine"], settings["fsdp_version"]) == (strategy, "torch", 2)
    assert settings["activation_checkpointing"] == ("on" if "activation_checkpointing" in fsdp else "off")


@pytest.mark.parametrize("text,offload,said", [
    # schemas/validation.py check_gradient_checkpointing_w_offload (axolotl@067b021): offload is checkpointing plus
    # activation_offloading true, offload_disk plus disk
    ("gradient_checkpointing: offload", True, None),
    ("gradient_checkpointing: true\nactivation_offloading: legacy", True, None),
    ("gradient_checkpointing: true\nactivation_offloading: hidden_states\nadapter: lora\nlora_r: 8", True, None),
    ("gradient_checkpointing: offload\nadapter: lora\nlora_r: 8", True, "replaces the recomputation"),
    ("gradient_checkpointing: offload_disk", True, "runs TRL's CPU offloader for it"),
    ("gradient_checkpointing: true\nactivation_offloading: disk", True, "runs TRL's CPU offloader for it"),
    ("gradient_checkpointing: true\nactivation_offloading: false", False, None),
    ("gradient_checkpointing: offload\nactivation_offloading: false", True, None),  # the schema sets it
    ("gradient_checkpointing: offload\ndeepspeed: {zero_optimization: {stage: 3}}", False, "on the DeepSpeed engine"),
])
def test_activation_offloading_offloads_the_checkpointed_inputs(tmp_path, text, offload, said):
    """TRL's offloader under checkpointing moves each checkpointed block's input to CPU memory (--activation-offload);
    with adapters axolotl runs it without recomputation (loaders/model.py _apply_activation_checkpointing), said."""
    config = _read(tmp_path, f"base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 2048\n{text}\n")
    assert config.settings["activation_checkpointing"] == "on"
    assert bool(config.settings.get("activation_offload")) is offload
    assert (said is None) == all("offload" not in note for note in config.notes), config.notes
    assert said is None or any(said in note for note in config.notes)


CCE = "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"


@pytest.mark.parametrize("text,loss", [(CCE + "bf16: auto", "fused"),
                                       (CCE + "bf16: true\ncut_cross_entropy: false", None),
                                       ("plugins: [axolotl.integrations.liger.LigerPlugin]\nbf16: true", None)])
def test_cut_cross_entropy_is_planned_as_the_fused_loss(tmp_path, text, loss):
    """axolotl's CutCrossEntropyPlugin (cut_cross_entropy defaults to true, integrations/cut_cross_entropy/args.py at
    067b021; 72 of the 252 example YAMLs list it) keeps no logits: --loss fused, said; another plugin changes nothing."""
    config = _read(tmp_path, f"base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 2048\n{text}\n")
    assert config.settings.get("loss") == loss
    said = any(note.startswith("Cut Cross-Entropy planned as --loss fused") for note in config.notes)
    assert said is (loss is not None)


def test_the_file_plans_what_the_same_options_typed_plan(capsys):
    def plan(*args: str) -> dict:
        code, out, err = run_main(["plan", "-g", "1xRTX4090", *args, "--json"], capsys)
        assert code == 0, err
        return json.loads(out)

    from_file = plan("-m", "meta-llama/Llama-2-7b-hf", "--from", str(CONFIGS / "axolotl_llama2_qlora.yml"))
    typed = plan("-m", "meta-llama/Llama-2-7b-hf", "--recipe", "trainer", "--strategy", "ddp", "--engine", "torch",
                 "--attention", "sdpa", "--lora", "32",
                 "--lora-targets", "all-linear", "--lora-dropout", "0.05", "--quantize", "nf4", "--double-quant",
                 "--micro-batch", "2", "--global-batch", "8", "--seq-len", "4096", "--precision", "bf16-mixed",
                 "--optimizer", "adamw", "--optimizer-impl", "fused", "--activation-checkpointing", "on")
    assert from_file["candidates"] == typed["candidates"]


@pytest.mark.parametrize("text,said", [
    ("base_model: m\nadapter: qlora\nlora_r: 8\nsequence_len: 512\n", "qlora needs load_in_4bit"),
    ("base_model: m\nadapter: ia3\nsequence_len: 512\n", "'ia3' is not modelled"),
    ("base_model: m\nadapter: lora\nsequence_len: 512\n", "lora_r is missing"),
    ("base_model: m\nload_in_4bit: true\nsequence_len: 512\n", "needs adapter"),
    ("base_model: m\nsequence_len: 0\n", "sequence_len must be at least 1"),
    ("base_model: m\nsequence_len: 512\nactivation_offloading: true\n", "needs gradient_checkpointing"),
    ("base_model: m\nsequence_len: 512\nfsdp_version: 2\nfsdp_config: {activation_checkpointing: true}\n"
     "activation_offloading: true\n", "needs gradient_checkpointing"),
    ("base_model: m\nsequence_len: 512\n" + CCE, "needs bf16 or fp16"),
    ("base_model: m\nsequence_len: 512\nbf16: true\nchunked_cross_entropy: true\n" + CCE, "refuses the pair"),
    ("base_model: m\nsequence_len: 512\nplugins: 7\n", "must be a list"),
    ("base_model: m\nsequence_len: 512\ngradient_checkpointing: true\nactivation_offloading: 7\n",
     "must be one of true, false, legacy, disk, hidden_states"),
])
def test_settings_axolotl_refuses_are_one_line_and_exit_2(tmp_path, capsys, text, said):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    code, out, err = run_main(["plan", "-g", "1xA100", "-m", "Qwen/Qwen2.5-0.5B", "--from", str(path)], capsys)
    assert code == 2 and not out and err.count("\n") == 1 and said in err, err
