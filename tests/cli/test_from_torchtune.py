"""``advisor plan --from`` on torchtune's own YAML configs (tests/cli/configs/torchtune_*.yaml, copied unchanged
from torchtune's recipes/configs at bd2a0fc7c): the knobs each fixes, read off the file by hand; the plan that
follows, its model named by the file's builder (``profiles/torchtune_models.json``); bad files are one line and
exit 2; and every mapped builder's shapes, read off torchtune's source into the table, are the bundled model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.planning.config_formats import read_config_file
from advisor.planning.config_torchtune import torchtune_models
from profiles import MODELS_DIR
from tests.cli._main import run_main

CONFIGS = Path(__file__).parent / "configs"
LLAMA_8B_LORA_TARGETS = "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # q, v, output_proj + the MLP's w1, w2, w3

# What each file says, read by hand: the knobs it fixes.
EXPECTED = {
    # lora_llama3_1_8b, lora_rank 8 on q_proj, v_proj, output_proj and the MLP (apply_lora_to_mlp True), dropout 0.0;
    # batch 2, accumulation 8, bf16, checkpointing False, AdamW fused, LinearCrossEntropyLoss; no FSDP key
    "torchtune_llama3_1_8b_lora.yaml": {
        "model": "meta-llama/Llama-3.1-8B", "lora_rank": 8, "lora_targets": LLAMA_8B_LORA_TARGETS, "micro_batch": 2,
        "gradient_accumulation": 8, "precision": "bf16", "activation_checkpointing": "off", "optimizer": "adamw",
        "optimizer_impl": "fused", "loss": "chunked", "recipe": "torchtune", "engine": "torch"},
    # qlora_llama3_2_3b: rank 64 on the same modules, NF4 base; batch 4, accumulation 8, bf16, checkpointing True,
    # AdamW fused, LinearCrossEntropyLoss; a single-device config (no FSDP key)
    "torchtune_llama3_2_3b_qlora_single_device.yaml": {
        "model": "meta-llama/Llama-3.2-3B", "lora_rank": 64, "lora_targets": LLAMA_8B_LORA_TARGETS, "quantize": "nf4",
        "micro_batch": 4, "gradient_accumulation": 8, "precision": "bf16", "activation_checkpointing": "on",
        "optimizer": "adamw", "optimizer_impl": "fused", "loss": "chunked", "recipe": "torchtune", "engine": "torch"},
    # llama3_1_8b full: batch 2, accumulation 1, bf16, checkpointing True, AdamW fused, LinearCrossEntropyLoss;
    # custom_sharded_layers makes it a distributed config: FSDP2 resharding after forward, no CPU offload (zero3)
    "torchtune_llama3_1_8b_full.yaml": {
        "model": "meta-llama/Llama-3.1-8B", "micro_batch": 2, "gradient_accumulation": 1, "precision": "bf16",
        "activation_checkpointing": "on", "optimizer": "adamw", "optimizer_impl": "fused", "loss": "chunked",
        "engine": "torch", "strategy": "zero3", "recipe": "torchtune"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_torchtunes_own_config_is_read_into_the_knobs_it_fixes(name):
    config = read_config_file(CONFIGS / name)
    assert config.format == "torchtune"
    assert config.settings == EXPECTED[name]
    assert {"optimizer.lr", "checkpointer.*", "metric_logger.*", "profiler.*"} <= set(config.not_read)
    assert any("max_seq_len is null" in note for note in config.notes)  # every one leaves the length to --seq-len


def _plan(capsys, *args: str) -> dict:
    code, out, err = run_main(["plan", *args, "--json"], capsys)
    assert code in (0, 3), err
    return json.loads(out)


def test_the_full_fine_tune_on_the_four_gpus_its_comment_names(capsys):
    """No --model: the builder names it. The file's FSDP run: zero3, micro-batch 2, checkpointing, pure bf16,
    fused AdamW, under the torchtune recipe; no accumulation (gradient_accumulation_steps 1)."""
    doc = _plan(capsys, "--gpus", "4xA100", "--seq-len", "2048", "--from",
                str(CONFIGS / "torchtune_llama3_1_8b_full.yaml"))
    rec, training = doc["recommendation"], doc["training"]
    assert doc["model"]["name"] == "meta-llama/Llama-3.1-8B"
    assert (rec["strategy"], rec["micro_batch_size"], rec["activation_checkpointing"]) == ("zero3", 2, True)
    assert (training["recipe"], training["precision"], training["optimizer_impl"], training["loss"]) == (
        "torchtune", "bf16", "fused", "chunked")
    assert training["global_batch_size"] is None


def test_the_single_device_qlora_on_a_4090(capsys):
    """Rank 64 adapters on q, v, o and the MLP over an nf4 base; accumulation 8 on one GPU: global batch 32."""
    doc = _plan(capsys, "--gpus", "1xRTX4090", "--seq-len", "2048", "--from",
                str(CONFIGS / "torchtune_llama3_2_3b_qlora_single_device.yaml"))
    training = doc["training"]
    assert training["lora"]["rank"] == 64 and training["lora"]["targets"] == LLAMA_8B_LORA_TARGETS.split(",")
    assert (training["quantize"], training["global_batch_size"], training["micro_batch_size"]) == ("nf4", 32, 4)
    rec = doc["recommendation"]
    ran = next(c for c in doc["candidates"] if c["strategy"] == rec["strategy"])
    assert (rec["strategy"], ran["runs_as"][:15], rec["gradient_accumulation_steps"]) == ("ddp", "the plain model", 8)


def test_the_text_output_names_the_builder_and_the_lora_keys(capsys):
    code, out, err = run_main(["plan", "-g", "2xA100", "--seq-len", "2048", "--from",
                               str(CONFIGS / "torchtune_llama3_1_8b_lora.yaml")], capsys)
    assert code == 0, err
    head = out.split("\n\n")[0].splitlines()
    assert head[0].endswith("(torchtune config (YAML)):")
    assert "  model._component_: torchtune.models.llama3_1.lora_llama3_1_8b -> --model meta-llama/Llama-3.1-8B" in head
    assert "  model.lora_rank: 8 -> --lora 8" in head
    assert ("  model.lora_attn_modules + apply_lora_to_mlp: ['q_proj', 'v_proj', 'output_proj'], mlp True -> "
            f"--lora-targets {LLAMA_8B_LORA_TARGETS}") in head


def test_params_typed_replace_the_builders_model(capsys):
    doc = _plan(capsys, "--params", "8B", "-g", "2xA100", "--from", str(CONFIGS / "torchtune_llama3_1_8b_full.yaml"))
    assert {"option": "model", "file_value": "meta-llama/Llama-3.1-8B", "given": "--params 8B"} in \
        doc["from_file"]["overridden"]


def _torchtune_yaml(model: str) -> str:
    return f"model:\n{model}\nbatch_size: 1\ndtype: bf16\n"


@pytest.mark.parametrize("model,message", [
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: '8'\n  lora_attn_modules: ['q_proj']",
     "model.lora_rank must be an integer, got '8'"),
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: 1099511627776\n  lora_attn_modules: [q_proj]",
     "model.lora_rank must be at most 65536, got 1099511627776"),
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: 8\n  lora_attn_modules: [[q_proj]]",
     "model.lora_attn_modules names ['q_proj']: torchtune's are"),
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: 8\n  lora_attn_modules: [q_proj]\n"
     "  lora_dropout: '0.05'", "model.lora_dropout must be a number from 0 to below 1, got '0.05'"),
    ("  _component_: torchtune.models.qwen2_5.qlora_qwen2_5_7b_base\n  lora_rank: 8\n  lora_attn_modules: [q_proj]",
     "names qlora_qwen2_5_7b_base: torchtune has no QLoRA builder for qwen2_5_7b_base"),
    ("  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_rank: 8\n  lora_attn_modules: [q_proj]\n"
     "  apply_lora_to_output: true", "model.apply_lora_to_output is true, which torchtune refuses for a head tied"),
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_attn_modules: ['q_proj']",
     "model.lora_rank is missing: lora_llama3_1_8b is a LoRA builder"),
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: 8\n  lora_attn_modules: ['qkv']",
     "model.lora_attn_modules names 'qkv': torchtune's are q_proj, k_proj, v_proj, output_proj"),
    ("  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora_rank: 8\n  lora_attn_modules: q_proj",
     "model.lora_attn_modules must be a list of q_proj, k_proj, v_proj, output_proj"),
])
def test_a_bad_lora_section_is_one_line_and_exit_2(model, message, tmp_path, capsys):
    path = tmp_path / "tune.yaml"
    path.write_text(_torchtune_yaml(model))
    code, out, err = run_main(["plan", "-g", "A100", "--from", str(path)], capsys)
    assert code == 2 and "Traceback" not in err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_an_unmapped_builder_leaves_the_model_to_the_command_line(tmp_path, capsys):
    path = tmp_path / "phi3.yaml"
    path.write_text(_torchtune_yaml("  _component_: torchtune.models.phi3.phi3_mini"))
    config = read_config_file(path)
    assert "model" not in config.settings and config.settings["recipe"] == "torchtune"
    assert any(note.startswith("model torchtune.models.phi3.phi3_mini is not mapped") for note in config.notes)
    code, _, err = run_main(["plan", "-g", "A100", "--from", str(path)], capsys)
    assert code == 2 and "model torchtune.models.phi3.phi3_mini is not mapped to a bundled model: give it with " \
        "--model" in err


def test_a_yaml_without_torchtune_components_stays_an_accelerate_config(tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text("model:\n  _component_: mylib.build\nmixed_precision: bf16\n")
    assert read_config_file(path).format == "accelerate"


@pytest.mark.parametrize("builder", sorted(torchtune_models()["builders"]))
def test_each_builder_is_mapped_to_a_bundled_model_of_its_shapes(builder):
    """The shapes in the table were read off torchtune's _model_builders.py; the bundled config.json must agree
    (tied embeddings only where the builder says, as Qwen2.5's small models and Llama 3.2 tie theirs)."""
    row = torchtune_models()["builders"][builder]
    cfg = json.loads((MODELS_DIR / f"{row['model']}.json").read_text())
    cfg = cfg.get("text_config", cfg)
    shapes = row["shapes"]
    assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"],
            cfg["intermediate_size"]) == (shapes["vocab_size"], shapes["num_layers"], shapes["num_heads"],
                                          shapes["embed_dim"], shapes["intermediate_dim"])
    assert cfg.get("num_key_value_heads", cfg["num_attention_heads"]) == shapes["num_kv_heads"]
    if "head_dim" in shapes:  # Gemma 2 passes its own (256, 256, 128), not hidden / heads
        assert cfg["head_dim"] == shapes["head_dim"]
    if "tie_word_embeddings" in shapes:  # PretrainedConfig's default is True
        assert cfg.get("tie_word_embeddings", True) == shapes["tie_word_embeddings"]


def _read(tmp_path, doc: dict):
    import yaml

    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(doc))
    return read_config_file(path)


FULL = {"_component_": "torchtune.models.llama3_1.llama3_1_8b"}
LORA = {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_rank": 8,
        "lora_attn_modules": ["q_proj", "v_proj"]}


@pytest.mark.parametrize("keys,setting,note", [
    # full_finetune_distributed (recipes/full_finetune_distributed.py): full AC when enable and no ac_mode; ac_mode
    # only when enable is false; both set: neither applied
    ({"enable_activation_checkpointing": True}, "on", None),
    ({"enable_activation_checkpointing": False, "ac_mode": "full"}, "on", None),
    ({"enable_activation_checkpointing": False, "ac_mode": "selective", "ac_option": "op"}, "selective", "per-op"),
    ({"enable_activation_checkpointing": True, "ac_mode": "selective", "ac_option": 2}, "off", "applies neither"),
    ({"enable_activation_checkpointing": False, "ac_mode": "selective", "ac_option": 2}, None, "one layer in 2"),
])
def test_checkpointing_follows_the_full_recipes_conditions(keys, setting, note, tmp_path):
    config = _read(tmp_path, {"model": FULL, **keys})
    assert config.settings.get("activation_checkpointing") == setting
    assert note is None or any(note in n for n in config.notes), config.notes


def test_the_lora_recipes_read_enable_activation_checkpointing_alone(tmp_path):
    config = _read(tmp_path, {"model": LORA, "enable_activation_checkpointing": True, "ac_mode": "selective",
                              "optimizer_in_bwd": True})
    assert config.settings["activation_checkpointing"] == "on" and "optimizer_in_backward" not in config.settings
    assert any(n.startswith("ac_mode is read by full_finetune_distributed only") for n in config.notes)
    assert any(n.startswith("optimizer_in_bwd is read by the full fine-tune recipes only") for n in config.notes)


def test_lora_keys_dora_dropout_quantize_base_and_duplicates(tmp_path):
    model = {**LORA, "lora_attn_modules": ["q_proj", "q_proj", "output_proj"], "use_dora": True, "lora_dropout": 0.05,
             "quantize_base": True}
    settings = _read(tmp_path, {"model": model}).settings
    assert (settings["lora_targets"], settings["dora"], settings["lora_dropout"], settings["quantize"]) == (
        "q_proj,o_proj", 1, "0.05", "nf4")


def test_dora_and_dropout_reach_the_plan(tmp_path, capsys):
    import yaml

    path = tmp_path / "dora.yaml"
    path.write_text(yaml.safe_dump({"model": {**LORA, "use_dora": True, "lora_dropout": 0.05}, "dtype": "bf16"}))
    lora = _plan(capsys, "-g", "1xA100", "--seq-len", "512", "--from", str(path))["training"]["lora"]
    assert (lora["dora"], lora["dropout"], lora["targets"]) == (True, 0.05, ["q_proj", "v_proj"])


def test_an_output_adapter_on_an_untied_head_is_left_out_and_said(tmp_path):
    config = _read(tmp_path, {"model": {**LORA, "apply_lora_to_output": True}})
    assert config.settings["lora_targets"] == "q_proj,v_proj"
    assert any(n.startswith("apply_lora_to_output: an adapter on the output projection is not modelled")
               for n in config.notes)


@pytest.mark.parametrize("keys,settings", [
    ({"fsdp_cpu_offload": True}, {"strategy": "zero3_offload", "engine": "torch"}),
    ({"fsdp_reshard_after_forward": False}, {"strategy": "zero2", "engine": "torch"}),
    ({"optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5}}, {"optimizer": "adamw", "optimizer_impl": "foreach"}),
    ({"optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW8bit"}}, {"optimizer": "adamw-8bit-paged"}),
    ({"compile": {"model": True, "loss": True}}, {"compile": 1}),
    ({"compile": True}, {"compile": 1}),
    ({"dtype": None}, {"precision": "fp32"}),  # torchtune/training/precision.py get_dtype(None): float32
    ({"loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"}}, {"loss": "chunked"}),
])
def test_each_key_sets_its_option(keys, settings, tmp_path):
    config = _read(tmp_path, {"model": FULL, **keys})
    assert settings.items() <= config.settings.items(), config.settings


def test_a_soft_capped_head_is_planned_with_the_full_logits_loss(tmp_path, capsys):
    """Gemma 2's own configs name LinearCrossEntropyLoss; the planner's chunked loss cannot soft-cap, so the plan
    counts the full logits (more memory), and says so, instead of refusing the file."""
    import yaml

    doc = {"model": {"_component_": "torchtune.models.gemma2.gemma2_2b"}, "dtype": "bf16",
           "loss": {"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"}}
    config = _read(tmp_path, doc)
    assert config.settings["loss"] == "hf" and any("soft-capping" in n for n in config.notes)
    path = tmp_path / "gemma.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert _plan(capsys, "-g", "1xA100", "--seq-len", "512", "--from", str(path))["training"]["loss"] == "hf"



def _tune_docs():
    from hypothesis import strategies as st

    values = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True), st.text(max_size=8),
                       st.sampled_from(["bf16", "fp32", "fp16", "selective", "op", "full", "q_proj", "output_proj",
                                        "torch.optim.AdamW", "torchtune.modules.loss.LinearCrossEntropyLoss"]),
                       st.lists(st.sampled_from(["q_proj", "v_proj", "output_proj", "x"]), max_size=3))
    model_keys = st.sampled_from(["lora_rank", "lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output",
                                  "lora_dropout", "use_dora", "quantize_base", "lora_alpha"])
    builders = st.sampled_from(["torchtune.models.llama3_1.lora_llama3_1_8b", "torchtune.models.qwen2_5.qlora_qwen2_5_3b",
                                "torchtune.models.llama3_2.lora_llama3_2_1b", "torchtune.models.gemma2.gemma2_2b",
                                "torchtune.models.phi3.phi3_mini"])
    model = st.builds(lambda builder, rest: {"_component_": builder, **rest}, builders,
                      st.dictionaries(model_keys, values, max_size=6))
    top = st.sampled_from(["batch_size", "gradient_accumulation_steps", "dtype", "enable_activation_checkpointing",
                           "ac_mode", "ac_option", "enable_activation_offloading", "compile", "optimizer_in_bwd",
                           "fsdp_cpu_offload", "fsdp_reshard_after_forward", "tensor_parallel_dim",
                           "data_parallel_shard_dim", "custom_sharded_layers", "optimizer", "loss", "tokenizer",
                           "dataset"])
    nested = st.one_of(values, st.dictionaries(st.sampled_from(["_component_", "fused", "max_seq_len", "packed",
                                                                "model", "loss"]), values, max_size=3))
    return st.builds(lambda m, rest: {"model": m, **rest}, st.one_of(model, values),
                     st.dictionaries(top, nested, max_size=8))


def test_any_torchtune_document_reads_or_is_a_one_line_value_error(tmp_path):
    """Hostile values anywhere a torchtune file has them: read, or one line naming the file (never another error)."""
    import yaml
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(doc=_tune_docs())
    def check(doc):
        path = tmp_path / "tune.yaml"
        text = yaml.safe_dump({**doc, "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer"}})
        path.write_text(text)
        try:
            config = read_config_file(path)
        except ValueError as err:
            assert "\n" not in str(err) and str(err).startswith("--from "), str(err)
            return
        assert config.format == "torchtune"
        assert all(isinstance(v.setting, (int, str)) for v in config.values)

    check()


def test_an_unknown_builder_without_model_names_the_builder(tmp_path, capsys):
    """A review: the file's unmapped builder was said only when --model was already given; without it the error was
    the generic 'give exactly one of --model or --params'."""
    path = tmp_path / "unknown.yaml"
    path.write_text("model:\n  _component_: torchtune.models.nonexistent.foo\nbatch_size: 2\n")
    code, out, err = run_main(["plan", "-g", "2xA100", "--from", str(path)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "model torchtune.models.nonexistent.foo is not mapped to a bundled model: give it with --model" in err
