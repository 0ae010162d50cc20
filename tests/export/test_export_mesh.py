"""Mesh plans exported: accelerate's loader, launcher and ParallelismConfig read back the degrees;
the Trainer's parallelism_config builds a ParallelismConfig; DeepSpeed gets Ulysses or a reason."""

from __future__ import annotations

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils.launch import prepare_multi_gpu_env

from advisor.export import export_text
from advisor.export.accelerate import render_accelerate
from advisor.export.deepspeed import build_deepspeed
from advisor.export.trainer import build_trainer_args
from advisor.export.write import write_export
from advisor.planning.api import plan
from tests.cli._main import run_main

LONG = dict(model="meta-llama/Llama-3.1-8B", gpus="8xH100", seq_len=131072)


@pytest.fixture(scope="module")
def long_plan():
    return plan(**LONG)


@pytest.fixture(scope="module")
def tp_plan():
    # Pinned: tensor parallelism 2 x context parallelism 2 x FSDP 2 on one node.
    return plan("meta-llama/Llama-3.1-8B", "8xH100", seq_len=32768, tp=2, cp=2)


def _env(path, monkeypatch):
    """The variables `accelerate launch --config_file path` exports, set here as the workers see them."""
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp and args.use_parallelism_config
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("which", ["long_plan", "tp_plan"])
def test_accelerate_reloads_the_mesh(tmp_path, monkeypatch, request, which):
    the_plan = request.getfixturevalue(which)
    mesh = the_plan.recommendation.mesh
    path = write_export(tmp_path / "accelerate_config.yaml", render_accelerate(the_plan))
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "FSDP" and loaded.num_processes == 8
    _env(path, monkeypatch)
    config = ParallelismConfig()  # reads the PARALLELISM_CONFIG_* variables the launcher exported
    assert (config.dp_replicate_size, config.dp_shard_size, config.cp_size, config.tp_size) == \
        (mesh.dp_replicate, mesh.dp_shard, mesh.cp, mesh.tp)
    assert config.total_size == 8


def test_tp_plan_pins_are_kept(tp_plan):
    mesh = tp_plan.recommendation.mesh
    assert (mesh.tp, mesh.cp, mesh.dp_shard) == (2, 2, 2)


def test_trainer_args_build_a_parallelism_config(long_plan):
    args = build_trainer_args(long_plan)
    config = ParallelismConfig(**args["parallelism_config"])
    assert (config.cp_size, config.dp_shard_size, config.total_size) == (8, 1, 8)
    assert args["fsdp"] is True and args["fsdp_config"]["version"] == 2


def test_deepspeed_gets_ulysses_for_cp_and_a_reason_for_tp(long_plan, tp_plan):
    doc = build_deepspeed(long_plan)
    # Eight Ulysses ranks share one sample: one data-parallel rank, micro-batch 1.
    assert doc["train_batch_size"] == 1 and doc["zero_optimization"]["stage"] == 3
    _, target = export_text(long_plan, "deepspeed-json")
    assert any("sp_size=8" in note for note in target.notes)
    with pytest.raises(ValueError, match="no tensor parallelism"):
        build_deepspeed(tp_plan)
    with pytest.raises(ValueError, match="ModelParallelStrategy"):
        export_text(long_plan, "lightning")


def test_launch_dry_run_on_a_mesh_config(tmp_path, capsys):
    config = tmp_path / "accelerate_config.yaml"
    code, out, err = run_main(["launch", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--seq-len", "32768",
                               "--tp", "2", "--cp", "2", "--config-file", str(config), "--dry-run", "train.py"], capsys)
    assert code == 0, err
    assert "accelerate launch --config_file" in out and not config.exists()  # a dry run writes nothing
    code, _, err = run_main(["export", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--seq-len", "32768",
                             "--tp", "2", "--cp", "2", "-o", str(config)], capsys)
    assert code == 0, err
    assert load_config_from_file(str(config)).parallelism_config["parallelism_config_tp_size"] == 2
