"""``advisor launch`` and ``advisor export`` commands, and a real 2-process launch on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner
from export_plans import PLANS, make_plan

from advisor.cli.export import export, launch
from advisor.export import get_format, ExportOptions, export_text
from advisor.export.write import write_export
from advisor.export.launch import build_launch_command, check_launchable, find_placeholders, launch_env, run_launch

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "ddp_step_script.py"
LAUNCH_TIMEOUT_S = 90


@click.group()
def cli():
    """A local group, as advisor/cli/main.py will register the commands."""


cli.add_command(export)
cli.add_command(launch)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_launch_command_is_exact():
    assert build_launch_command("cfg.yaml", "train.py", ["--lr", "3e-4"]) == [
        "accelerate", "launch", "--config_file", "cfg.yaml", "train.py", "--lr", "3e-4"]


def test_dry_run_prints_the_exact_command_and_passes_script_options_through(in_tmp):
    result = CliRunner().invoke(cli, ["launch", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--dry-run", "train.py",
                                      "--model", "mine", "--lr", "3e-4", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == (
        "accelerate launch --config_file accelerate_config.yaml train.py --model mine --lr 3e-4 --dry-run")
    assert not (in_tmp / "accelerate_config.yaml").exists()  # a dry run writes nothing (issue 21, item 18)
    exported = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "-o", "-"])
    assert yaml.safe_load(exported.stdout)["distributed_type"] == "MULTI_GPU"


def test_launch_refuses_unfilled_placeholders(in_tmp, monkeypatch):
    import advisor.hardware.local_gpus as local_gpus_module

    monkeypatch.setattr(local_gpus_module, "detect_local_gpus", lambda **kw: "8xNVIDIA H100 80GB HBM3")
    (in_tmp / "train.py").write_text("")
    result = CliRunner().invoke(cli, ["launch", "--model", "Qwen/Qwen2.5-72B", "--gpus", "8xH100", "--nodes", "2",
                                      "train.py"])
    assert isinstance(result.exception, ValueError)
    message = str(result.exception)
    assert "\n" not in message and "<MACHINE_RANK>" in message and "<MAIN_NODE_IP>" in message
    with pytest.raises(ValueError, match="placeholders"):
        run_launch(["true"], config_path=in_tmp / "accelerate_config.yaml")


def test_find_placeholders_and_filled_config_passes(tmp_path):
    path = write_export(tmp_path / "c.yaml", export_text(make_plan(**PLANS["qwen72b_2nodes"]), "accelerate")[0])
    assert find_placeholders(yaml.safe_load(path.read_text())) == ["<MACHINE_RANK>", "<MAIN_NODE_IP>"]
    path.write_text(path.read_text().replace("<MACHINE_RANK>", "0").replace("<MAIN_NODE_IP>", "10.0.0.1"))
    assert check_launchable(path)["main_process_ip"] == "10.0.0.1"


def test_cpu_config_sets_accelerate_use_cpu_for_the_workers():
    assert launch_env({"use_cpu": True}, {"A": "1"}) == {"A": "1", "ACCELERATE_USE_CPU": "true"}
    assert launch_env({"use_cpu": False}, {"A": "1"}) == {"A": "1"}


def test_export_writes_refuses_overwrite_and_forces(in_tmp):
    args = ["export", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "-o", "cfg.yaml"]
    first = CliRunner().invoke(cli, args)
    # zero3, not the torch recipe's zero2_offload: the accelerate format plans with the trainer recipe, whose fused
    # AdamW step holds no state-sized temporary, so zero3 fits on the GPUs (issue 19's README case).
    assert first.exit_code == 0 and "wrote cfg.yaml (accelerate: zero3 on torch, 2 processes)" in first.stdout
    again = CliRunner().invoke(cli, args)  # the same text: nothing written, and said so (it said "wrote")
    assert again.exit_code == 0 and "kept cfg.yaml, which holds this already (accelerate:" in again.stdout
    (in_tmp / "cfg.yaml").write_text("edited\n")
    second = CliRunner().invoke(cli, args)
    assert isinstance(second.exception, ValueError) and "--force" in str(second.exception)
    assert (in_tmp / "cfg.yaml").read_text() == "edited\n"
    assert CliRunner().invoke(cli, args + ["--force"]).exit_code == 0
    assert "distributed_type: FSDP" in (in_tmp / "cfg.yaml").read_text()


def test_export_every_format_to_its_default_file(in_tmp):
    for fmt, name in [("deepspeed-json", "ds_config.json"), ("torchrun", "launch.sh"),
                      ("trainer-args", "training_args.json"), ("lightning", "lightning_strategy.py")]:
        result = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--format", fmt])
        assert result.exit_code == 0, result.output
        recipe = get_format(fmt).row.recipe  # the CLI plans each format with its own recipe row
        assert (in_tmp / name).read_text() == export_text(make_plan("Qwen/Qwen2.5-0.5B", recipe=recipe), fmt)[0]


def test_export_of_a_pinned_strategy_it_cannot_write_names_the_one_to_plan(in_tmp):
    # --strategy zero1 on torch: the accelerate format plans with the trainer recipe, whose loop cannot run it (no
    # ZeroRedundancyOptimizer in accelerate or the Trainer), so exit 2 naming the engine that runs it; under the torch
    # recipe the plan evaluates nothing else, and the export estimates nothing, so exit 2 naming what to plan instead.
    result = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-3B", "--gpus", "2xA100", "--strategy", "zero1", "-o", "-"])
    assert isinstance(result.exception, ValueError) and not result.stdout
    message = str(result.exception)
    assert "the trainer recipe does not run DDP + ZeroRedundancyOptimizer" in message
    assert message.endswith("--engine deepspeed runs zero1 (DeepSpeed ZeRO stage 1)")
    result = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-3B", "--gpus", "2xA100", "--strategy", "zero1",
                                      "--recipe", "torch", "-o", "-"])
    message = str(result.exception)
    assert message.startswith("zero1 on the torch engine") and "--engine deepspeed" in message
    assert message.endswith("plan it with --strategy ddp")


def test_export_refuses_when_nothing_fits(in_tmp):
    result = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "--strategy", "ddp"])
    assert isinstance(result.exception, ValueError)
    assert "ddp does not fit" in str(result.exception) and "fits on these 2 x A100-80GB-SXM" in str(result.exception)
    assert not (in_tmp / "accelerate_config.yaml").exists()


def test_export_directory_output_is_refused(in_tmp):
    result = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "-o", str(in_tmp)])
    assert isinstance(result.exception, ValueError) and "names a directory" in str(result.exception)


def test_export_size_only_model(in_tmp):
    result = CliRunner().invoke(cli, ["export", "--model", "3B", "--gpus", "2xA100", "--strategy", "zero3", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert "SIZE_BASED_WRAP" in result.stdout


def _accelerate() -> list[str]:
    """`accelerate launch` from this interpreter's environment."""
    exe = Path(sys.executable).with_name("accelerate")
    return [str(exe), "launch"] if exe.exists() else [sys.executable, "-m", "accelerate.commands.launch"]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]))
    env.pop("ACCELERATE_USE_CPU", None)
    return env


def test_real_two_process_launch_on_cpu(tmp_path, free_port):
    """accelerate launch with the exported --cpu config starts 2 gloo ranks that take one DDP step."""
    plan = make_plan("Qwen/Qwen2.5-0.5B")
    text = export_text(plan, "accelerate", ExportOptions(cpu=True))[0]
    config = write_export(tmp_path / "cpu.yaml", text)
    command = [*_accelerate(), "--config_file", str(config), "--num_processes", "2",
               "--main_process_port", str(free_port), str(SCRIPT)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, cwd=tmp_path,
                          env=_worker_env())
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [line.split()[1] for line in lines] == ["0/2", "1/2"], done.stdout + done.stderr
    assert all("ok=True" in line and "mixed_precision=no" in line for line in lines)
    # wrap() inside the launched job picks DDP itself: two processes and a model under 1B parameters
    # (the script's 161-parameter MLP), the same strategy the exported plan recommends for Qwen2.5-0.5B.
    assert plan.recommendation.strategy == "ddp"
    assert all("wrappers.wrap strategy=ddp " in line for line in lines), lines


def test_advisor_launch_cpu_runs_a_real_two_process_job(in_tmp, monkeypatch, capfd):
    """advisor launch --cpu: the CLI writes the config and the command; run_launch runs it (with a deadline)."""
    for key, value in _worker_env().items():
        monkeypatch.setenv(key, value)
    exported = CliRunner().invoke(cli, ["export", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "-o", "accelerate_config.yaml"])
    assert exported.exit_code == 0, exported.output  # a dry run writes nothing: export writes the config
    result = CliRunner().invoke(cli, ["launch", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--cpu", "--dry-run", str(SCRIPT)])
    assert result.exit_code == 0, result.output
    command = result.stdout.strip().splitlines()[-1].split()
    assert command == build_launch_command("accelerate_config.yaml", str(SCRIPT))
    assert run_launch(command, config_path="accelerate_config.yaml", timeout_s=LAUNCH_TIMEOUT_S) == 0
    lines = sorted(line for line in capfd.readouterr().out.splitlines() if line.startswith("rank "))
    assert [line.split()[1] for line in lines] == ["0/2", "1/2"]
    assert all("ok=True" in line and "group=accelerate:MULTI_CPUx2" in line for line in lines), lines
