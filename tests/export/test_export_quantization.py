"""Exports of a QLoRA plan (``--quantize``): the BitsAndBytesConfig the notes give is accepted by
transformers' own class with the plan's settings; the accelerate YAML reloads through accelerate's
loader and launcher, and its FSDP2 / DeepSpeed plugins read the keys QLoRA needs."""

from __future__ import annotations

import re

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

from advisor.export import resolve_target
from advisor.export.accelerate import render_accelerate
from advisor.export.write import write_export
from advisor.planning.api import plan

MODEL = "Qwen/Qwen2.5-0.5B"


def _qlora_plan(quantize="nf4", **options):
    return plan(MODEL, "2xA100", lora=8, quantize=quantize, **options)


def _env(tmp_path, qplan, monkeypatch):
    path = write_export(tmp_path / "accelerate_config.yaml", render_accelerate(qplan))
    load_config_from_file(str(path))  # accelerate's own reader accepts it
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        env = prepare_deepspeed_cmd_env(args)[1]
    else:
        env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return path.read_text()


def _bnb_config(text: str):
    """The BitsAndBytesConfig(...) call in the export's QLoRA note, built by transformers."""
    import torch
    from transformers import BitsAndBytesConfig

    call = re.search(r"quantization_config=(BitsAndBytesConfig\(.*?\)), dtype=", text).group(1)
    return eval(call, {"BitsAndBytesConfig": BitsAndBytesConfig, "torch": torch})  # noqa: S307 - our own output


@pytest.mark.parametrize("scheme,double", [("nf4", True), ("fp4", False)])
def test_fsdp_qlora_config_reloads_and_names_the_storage_dtype(tmp_path, monkeypatch, scheme, double):
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    qplan = _qlora_plan(scheme, strategy="zero3", double_quant=double)
    text = _env(tmp_path, qplan, monkeypatch)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.cpu_ram_efficient_loading is True
    assert plugin.use_orig_params is None  # FSDP2: obsolete, and not written
    config = _bnb_config(text)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == scheme
    assert config.bnb_4bit_use_double_quant is double
    assert config.bnb_4bit_quant_storage == torch.bfloat16 == config.bnb_4bit_compute_dtype
    assert "fsdp_use_orig_params is not written" in text


def test_deepspeed_zero3_qlora_sets_zero3_init(tmp_path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    qplan = _qlora_plan(engine="deepspeed", strategy="zero3")
    text = _env(tmp_path, qplan, monkeypatch)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 3 and plugin.zero3_init_flag is True
    assert _bnb_config(text).bnb_4bit_quant_storage is not None
    assert "zero3_init_flag: true" in text


def test_int8_ddp_export_loads_in_8bit(tmp_path, monkeypatch):
    qplan = _qlora_plan("int8", strategy="ddp")
    text = _env(tmp_path, qplan, monkeypatch)
    config = _bnb_config(text)
    assert config.load_in_8bit and not config.load_in_4bit
    target = resolve_target(qplan, "accelerate")
    assert not any("shard" in note for note in target.notes)  # ddp keeps whole weights: no storage-dtype note


def test_fp16_autocast_stores_the_4bit_weights_in_fp32(tmp_path, monkeypatch):
    """PEFT's docs: with fp16 mixed precision, bnb_4bit_quant_storage float32 (compute stays fp16)."""
    import torch

    text = _env(tmp_path, _qlora_plan(strategy="zero3", precision="fp16-mixed"), monkeypatch)
    config = _bnb_config(text)
    assert config.bnb_4bit_quant_storage == torch.float32 and config.bnb_4bit_compute_dtype == torch.float16
    assert "dtype=torch.float32)" in text


@pytest.mark.parametrize("recipe,frozen,dtype", [("trainer", None, "bfloat16"), ("trainer", "param", "float32"),
                                                 ("lightning", None, "float32")])
def test_a_lora_export_says_the_dtype_the_plan_holds_the_base_in(recipe, frozen, dtype):
    """The base's dtype is the script's from_pretrained call, no config key: the note names the one the plan counted
    (the trainer recipe: bf16 as loaded; --frozen-base param or Lightning's bf16-mixed: fp32), and TRL's default."""
    import torch

    options = {"frozen_base": frozen} if frozen else {}
    notes = resolve_target(plan(MODEL, "2xA100", lora=8, recipe=recipe, **options), "accelerate").notes
    said = [note for note in notes if note.startswith("The plan holds the frozen base")]
    assert len(said) == 1 and f"dtype=torch.{dtype})" in said[0], notes
    assert isinstance(getattr(torch, dtype), torch.dtype)
    qnotes = resolve_target(_qlora_plan(recipe=recipe), "accelerate").notes  # a 4-bit base: the QLoRA note's dtype
    assert not any(note.startswith("The plan holds the frozen base") for note in qnotes)
