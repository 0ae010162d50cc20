"""``advisor plan --from`` on a TRL CLI config or an alignment-handbook recipe: one YAML holding TrainingArguments,
TRL's own keys and TRL's ModelConfig (the model, its adapters, its quantised base). A review found them read as an
accelerate config: nothing taken (not the micro-batch, the length, the checkpointing or the LoRA), and a
``distributed_type: NO`` the file never said. Expected values are read off each document by hand (the fixtures'
first lines cite them) and TRL's defaults from trl/trainer/model_config.py and sft_config.py at f2cd577."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.planning.config_formats import read_config_file
from tests.cli._main import run_main

CONFIGS = Path(__file__).parent / "configs"


def test_trls_cli_example_plans_sft_with_trls_defaults():
    """model_name_or_path, a dataset, a learning rate: the model is the file's, the rest SFTConfig's defaults
    (per_device_train_batch_size 8, bf16 and gradient checkpointing on, max_length 1024, loss_type chunked_nll)."""
    config = read_config_file(CONFIGS / "trl_cli_example.yaml")
    assert config.format == "trainer" and config.title.endswith("(YAML)")
    assert config.settings == {"model": "Qwen/Qwen2.5-0.5B", "micro_batch": 8, "precision": "bf16-mixed",
                               "seq_len": 1024, "loss": "chunked", "activation_checkpointing": "on",
                               "recipe": "trainer"}
    assert set(config.not_read) == {"dataset_name", "report_to", "learning_rate", "lr_scheduler_type"}
    assert any("does not name its trainer" in note for note in config.notes)


def test_the_handbooks_qlora_recipe_reads_its_adapters_and_4_bit_base():
    """Mistral-7B-v0.1, flash_attention_2 (no score matrix: planned as SDPA), 4-bit (bnb_4bit_quant_type left at
    nf4, use_bnb_nested_quant at false), LoRA rank 16 on seven projections with dropout 0.05, 4 samples x 2 steps
    of accumulation, checkpointing, bf16, 2,048 tokens."""
    config = read_config_file(CONFIGS / "handbook_zephyr_sft_qlora.yaml")
    assert config.settings == {
        "model": "mistralai/Mistral-7B-v0.1", "attention": "sdpa", "lora_rank": 16,
        "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "lora_dropout": "0.05",
        "quantize": "nf4", "double_quant": 0, "micro_batch": 4, "gradient_accumulation": 2,
        "precision": "bf16-mixed", "seq_len": 2048, "loss": "chunked", "activation_checkpointing": "on",
        "recipe": "trainer"}


def _plan(capsys, *args: str) -> dict:
    code, out, err = run_main(["plan", *args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_the_file_plans_what_the_same_options_typed_plan(capsys):
    """The recipe read from the file and the options it stands for, typed: the same candidates."""
    from_file = _plan(capsys, "-g", "1xA100", "--from", str(CONFIGS / "handbook_zephyr_sft_qlora.yaml"))
    typed = _plan(capsys, "-m", "mistralai/Mistral-7B-v0.1", "-g", "1xA100", "--recipe", "trainer", "--attention",
                  "sdpa", "--lora", "16", "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                  "--lora-dropout", "0.05", "--quantize", "nf4", "--no-double-quant", "--micro-batch", "4",
                  "--global-batch", "8", "--precision", "bf16-mixed", "--seq-len", "2048", "--loss", "chunked",
                  "--activation-checkpointing", "on")
    assert from_file["candidates"] == typed["candidates"]
    assert from_file["recommendation"] == typed["recommendation"]


def _read(tmp_path: Path, doc: dict):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return read_config_file(path)


def test_an_older_sftconfig_with_max_seq_length_runs_nll_and_the_trainers_defaults(tmp_path):
    """max_seq_length is SFTConfig's name for the length in TRL 0.9-0.19 (removed in 0.20, trl#3704): the run is
    older than chunked_nll (1.4.0) and than TRL's own checkpointing and bf16 defaults (0.22, trl#3510)."""
    config = _read(tmp_path, {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_seq_length": 4096})
    assert (config.settings["seq_len"], config.settings["loss"], config.settings["activation_checkpointing"]) == (
        4096, "hf", "off")
    assert "precision" not in config.settings


def test_a_yaml_with_an_accelerate_key_stays_an_accelerate_config(tmp_path):
    config = _read(tmp_path, {"distributed_type": "MULTI_GPU", "num_processes": 2, "learning_rate": 1e-4})
    assert config.format == "accelerate" and config.settings["num_gpus"] == 2


def test_a_bf16_full_fine_tune_says_what_ddp_holds(tmp_path):
    config = _read(tmp_path, {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16"})
    assert any(note.startswith("dtype bfloat16: a full fine-tune keeps 16-bit weights") for note in config.notes)
    config = _read(tmp_path, {"packing": True, "model_init_kwargs": {"dtype": "bfloat16"}})  # SFTConfig's own
    assert any(n.startswith("model_init_kwargs.dtype bfloat16: a full fine-tune keeps 16-bit") for n in config.notes)
    config = _read(tmp_path, {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "use_peft": True})
    assert config.settings["lora_rank"] == 16 and config.settings["lora_dropout"] == "0.05"
    assert config.settings["frozen_base"] == "param"  # dtype not set: TRL's float32 (the test below)


def test_model_keys_trl_refuses_are_one_line_and_exit_2(tmp_path, capsys):
    for doc, said in (({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "load_in_4bit": True}, "needs use_peft"),
                      ({"use_peft": True, "lora_target_modules": 5, "max_length": 512}, "lora_target_modules must"),
                      ({"use_peft": True, "lora_dropout": 1.5, "max_length": 512}, "lora_dropout must"),
                      ({"use_peft": True, "load_in_4bit": True, "load_in_8bit": True, "max_length": 512}, "both"),
                      ({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "int7"}, "dtype must be one of")):
        path = tmp_path / "bad.yaml"
        path.write_text(json.dumps(doc))
        code, out, err = run_main(["plan", "-g", "2xA100", "-m", "Qwen/Qwen2.5-0.5B", "--from", str(path)], capsys)
        assert code == 2 and not out and err.count("\n") == 1 and said in err, (doc, err)


def test_the_files_model_gives_way_to_a_typed_one(capsys):
    code, out, err = run_main(["plan", "-m", "Qwen/Qwen2.5-1.5B", "-g", "2xA100", "--from",
                               str(CONFIGS / "trl_cli_example.yaml"), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["model"]["name"] == "Qwen/Qwen2.5-1.5B"
    (override,) = [o for o in doc["from_file"]["overridden"] if o["option"] == "model"]
    assert override["file_value"] == "Qwen/Qwen2.5-0.5B"


def test_a_trl_lora_base_rests_in_the_dtype_trl_loads_it_in(tmp_path, capsys):
    """TRL loads a model named by a string in ModelConfig's dtype, float32 unless the file says
    (trl/trainer/model_config.py dtype default "float32", trl/trainer/utils.py create_model_from_path at f2cd577), so a
    LoRA of Qwen2.5-0.5B (494,032,768 weights; rank 16 on q_proj and v_proj, PEFT's targets for qwen2: 24 x 16 x
    (896 + 896 + 896 + 128) = 1,081,344 adapter weights, fp32) rests at 4 x 494,032,768 + 4 x 1,081,344 =
    1,980,456,448 bytes; with dtype: bfloat16, 2 x 494,032,768 + 4 x 1,081,344 = 992,390,912."""
    rested = {}
    for dtype in (None, "bfloat16", "float32"):
        path = tmp_path / f"{dtype}.yaml"
        path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\n" +
                        (f"dtype: {dtype}\n" if dtype else ""))
        config = read_config_file(path)
        assert config.settings["frozen_base"] == ("compute" if dtype == "bfloat16" else "param")
        plan = _plan(capsys, "-g", "1xA100", "--strategy", "ddp", "--from", str(path))
        rested[dtype] = plan["candidates"][0]["memory_bytes"]["states_params"]
    assert rested == {None: 1_980_456_448, "bfloat16": 992_390_912, "float32": 1_980_456_448}


def test_a_quantised_trl_base_leaves_the_dtype_to_the_k_bit_preparation(tmp_path):
    """load_in_4bit: the 4-bit linears have their own bytes and the preparation upcasts the rest (planned as before):
    the file's dtype is a note, not a setting."""
    path = tmp_path / "qlora.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\nload_in_4bit: true\n")
    config = read_config_file(path)
    assert "frozen_base" not in config.settings
    assert any(note.startswith("dtype not set: TRL ModelConfig's default float32: the modules left unquantised")
               for note in config.notes)


def test_frozen_base_without_a_lora_base_it_could_hold_is_one_line_and_exit_2(capsys):
    for extra in ([], ["--lora", "8", "--quantize", "nf4"]):
        code, out, err = run_main(["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "1xA100", "--frozen-base", "param",
                                   *extra], capsys)
        assert code == 2 and not out and err.count("\n") == 1 and "give it with --lora" in err, err


def test_auto_null_and_an_overwritten_model_init_kwargs_dtype(tmp_path):
    """dtype auto or null loads the checkpoint's dtype (create_model_from_path passes them on; transformers 5 reads
    None as "auto"): the compute dtype planned. trl sft replaces model_init_kwargs with ModelConfig's dtype
    (trl/scripts/sft.py), so there it is said to be ignored and TRL's float32 is planned."""
    for text, held in (("dtype: auto", "compute"), ("dtype: null", "compute"),
                       ("model_init_kwargs: {dtype: bfloat16}", "param")):
        path = tmp_path / "c.yaml"
        path.write_text(f"model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\n{text}\n")
        config = read_config_file(path)
        assert config.settings["frozen_base"] == held, text
        assert "dtype" not in " ".join(config.not_read), config.not_read
    assert any("trl sft replaces model_init_kwargs" in note for note in config.notes)


def test_a_typed_quantize_sets_the_files_dtype_aside(tmp_path, capsys):
    """A LoRA file (TRL's float32 base) planned with --quantize typed: the 4-bit base has its own bytes, so the file's
    frozen-base dtype is reported as overridden and the plan is the QLoRA one, not an error."""
    path = tmp_path / "lora.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\n")
    code, out, err = run_main(["plan", "-g", "1xA100", "--from", str(path), "--quantize", "nf4", "--json"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["training"]["quantize"] == "nf4" and "frozen_base" not in plan["training"]
    assert plan["from_file"]["overridden"] == [{"option": "frozen_base", "file_value": "param",
                                                "given": "--quantize nf4"}]
