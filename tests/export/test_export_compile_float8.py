"""--compile and --float8 in each export: the keys each framework reads, checked by the framework; a note where
a format has none (the same path as --optimizer-in-backward's)."""

from __future__ import annotations

import json
import tomllib

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from export_plans import make_plan
from test_export_accelerate import _launcher_env, _write
from test_export_torchtitan import _check_keys

from advisor.export import export_text

MODEL = "meta-llama/Llama-3.1-8B"  # float8 is planned on the torch engine in bf16-mixed (advisor.training)


@pytest.fixture(scope="module")
def plan_on():
    return make_plan(MODEL, "8xH100", compile=True, float8=True, float8_all_gather=True)


@pytest.fixture(scope="module")
def plan_off():
    return make_plan(MODEL, "8xH100")


def test_accelerate_loads_compile_and_float8_as_its_launcher_reads_them(tmp_path, plan_on, monkeypatch):
    path = _write(tmp_path, plan_on)
    loaded = load_config_from_file(str(path))
    assert loaded.dynamo_config == {"dynamo_backend": "INDUCTOR", "dynamo_use_regional_compilation": True}
    assert loaded.mixed_precision == "fp8"
    assert loaded.fp8_config == {"backend": "AO", "enable_fsdp_float8_all_gather": True}
    # The launcher refuses fp8 without TE / MS-AMP / torchao installed; none is here, so say one is.
    monkeypatch.setattr("accelerate.utils.launch.is_fp8_available", lambda: True)
    _, env = _launcher_env(path)
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] == "True"
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp8"
    assert env["ACCELERATE_FP8_BACKEND"] == "AO"
    assert env["ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"] == "True"
    from accelerate.utils import TorchDynamoPlugin
    from accelerate.utils.dataclasses import DynamoBackend, FP8BackendType
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dynamo = TorchDynamoPlugin()  # what Accelerator() builds from the workers' environment
    assert dynamo.backend == DynamoBackend.INDUCTOR and dynamo.use_regional_compilation
    assert FP8BackendType(env["ACCELERATE_FP8_BACKEND"]) == FP8BackendType.AO  # Accelerator.fp8_backend's parse


def test_accelerate_without_all_gather_writes_false_against_the_launchers_true_default(tmp_path, monkeypatch):
    from accelerate.utils.environment import parse_flag_from_env
    path = _write(tmp_path, make_plan(MODEL, "8xH100", float8=True))
    assert load_config_from_file(str(path)).fp8_config == {"backend": "AO", "enable_fsdp_float8_all_gather": False}
    assert "dynamo_config" not in path.read_text()
    monkeypatch.setattr("accelerate.utils.launch.is_fp8_available", lambda: True)
    env = _launcher_env(path)[1]
    assert env["ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"] == "False"
    monkeypatch.setenv("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "False")  # AORecipeKwargs reads it so
    assert parse_flag_from_env("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", default=True) is False


def test_accelerate_off_writes_neither(tmp_path, plan_off):
    loaded = load_config_from_file(str(_write(tmp_path, plan_off)))
    assert loaded.dynamo_config == {} and loaded.fp8_config == {} and loaded.mixed_precision == "bf16"


def test_trainer_args_compile_is_read_by_training_arguments_and_float8_is_a_note(tmp_path, plan_on):
    from transformers import TrainingArguments
    text, target = export_text(plan_on, "trainer-args")
    doc = json.loads(text)
    assert (doc["torch_compile"], doc["torch_compile_backend"]) == (True, "inductor")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                             **{k: doc[k] for k in ("torch_compile", "torch_compile_backend")})
    assert args.torch_compile and args.torch_compile_backend == "inductor"
    assert any("(--float8): no trainer-args key" in note for note in target.notes)
    assert not any("(--compile)" in note for note in target.notes)


def test_torchtitan_writes_compile_and_the_float8_converter(plan_on):
    text, target = export_text(plan_on, "torchtitan")
    doc = tomllib.loads(text)
    assert doc["compile"] == {"enable": True, "components": ["model"], "backend": "inductor"}
    assert doc["model"] == {"converters": ["quantize.linear.float8"]}
    assert doc["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
                                                  "precompute_float8_dynamic_scale_for_fsdp": True}
    assert "recipe_name" not in doc["quantize"]["linear"]["float8"]  # with one, torchtitan asserts all-gather off
    from advisor.export.torchtitan import torchtitan_doc
    _check_keys(torchtitan_doc(target, plan_on.model))
    assert not any("--compile" in n or "--float8" in n for n in target.notes)


def test_torchtitan_off_writes_neither(plan_off):
    doc = tomllib.loads(export_text(plan_off, "torchtitan")[0])
    assert not {"compile", "model", "quantize"} & set(doc)


@pytest.mark.parametrize("fmt", ["torchrun", "lightning"])
def test_formats_without_keys_say_so_once(fmt, plan_on):
    text, target = export_text(plan_on, fmt)
    compile_notes = [n for n in target.notes if "(--compile): no " + fmt + " key says it" in n]
    float8_notes = [n for n in target.notes if "(--float8): no " + fmt + " key says it" in n]
    assert len(compile_notes) == 1 and len(float8_notes) == 1
    assert "enable_fsdp_float8_all_gather=True" in float8_notes[0]
    assert compile_notes[0] in text  # the note reaches the written file


def test_in_backward_note_is_unchanged_beside_them():
    plan = make_plan("Qwen/Qwen2.5-0.5B", "1xH100", compile=True, optimizer_in_backward=True)  # one GPU only
    notes = export_text(plan, "torchrun")[1].notes
    assert sum("(--optimizer-in-backward): no file says it" in n for n in notes) == 1
    assert sum("(--compile)" in n for n in notes) == 1


@pytest.mark.parametrize("fmt, name", [("accelerate", "a.yaml"), ("torchtitan", "t.toml")])
def test_plan_from_the_export_reads_compile_and_float8_back(tmp_path, plan_on, fmt, name):
    from advisor.planning.config_formats import read_config_file
    path = tmp_path / name
    path.write_text(export_text(plan_on, fmt)[0])
    settings = read_config_file(str(path)).settings
    assert (settings["compile"], settings["float8"], settings["float8_all_gather"]) == (1, 1, 1)


def test_accelerate_fp8_of_another_backend_is_not_planned_as_float8(tmp_path):
    from advisor.planning.config_formats import read_config_file
    path = tmp_path / "te.yaml"
    path.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp8\nfp8_config:\n  backend: TE\n"
                    "dynamo_config:\n  dynamo_backend: INDUCTOR\n")
    config = read_config_file(str(path))
    assert "float8" not in config.settings and config.settings["compile"] == 1
    assert any("fp8 is not modelled" in n for n in config.notes)
    assert any("compiles the whole model" in n for n in config.notes)
