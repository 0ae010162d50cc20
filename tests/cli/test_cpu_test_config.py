"""``--cpu`` needs no ``--gpus`` (issue 10, item 10): the CPU test config is DDP on gloo, fp32, with
``--processes N`` (default 2) processes, and its header says exactly that; the launch refusal names
only options that exist. GPU detection is stubbed to "no GPU"; nothing is launched.
"""

from __future__ import annotations

import re

import pytest
import yaml

import advisor.export.launch as launch_module
import advisor.hardware.local_gpus as local_gpus_module
from advisor.cli.export import launch as launch_command
from tests.cli._main import run_main as _run

SMALL = ["--model", "Qwen/Qwen2.5-0.5B"]


@pytest.fixture
def no_gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(local_gpus_module, "detect_local_gpus", lambda **kw: None)
    launched = []
    monkeypatch.setattr(launch_module, "run_launch", lambda command, **kw: launched.append(command) or 0)
    return launched


def _header(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def test_export_cpu_needs_no_gpus(no_gpu, tmp_path, capsys):
    code, out, err = _run(["export", *SMALL, "--cpu", "-o", "cpu.yaml"], capsys)
    assert code == 0, err
    text = (tmp_path / "cpu.yaml").read_text()
    doc = yaml.safe_load(text)
    assert (doc["num_processes"], doc["use_cpu"], doc["mixed_precision"]) == (2, True, "no")
    header = _header(text)
    # What runs: 2 CPU processes, fp32, micro-batch 1 (nothing given); no GPU, no bf16.
    assert "on 2 CPU processes (gloo test config): micro-batch 1 of " in header
    assert "precision fp32" in header and "Per-process batch size in the script: 1." in header
    assert "bf16" not in header and "A100" not in header and "GPU" not in header.replace("GPU plan", "")


def test_processes_and_micro_batch_are_what_the_config_says(no_gpu, tmp_path, capsys):
    code, _, err = _run(["export", *SMALL, "--cpu", "--processes", "3", "--micro-batch", "4", "--precision",
                         "bf16-mixed", "-o", "cpu.yaml"], capsys)
    assert code == 0, err
    text = (tmp_path / "cpu.yaml").read_text()
    assert yaml.safe_load(text)["num_processes"] == 3
    assert "on 3 CPU processes (gloo test config): micro-batch 4 of " in text
    assert "--precision bf16-mixed is not used: the CPU test config runs fp32" in err


def test_global_batch_sets_accumulation_over_the_cpu_processes(no_gpu, tmp_path, capsys):
    # 24 samples a step = micro-batch 4 x 3 processes x 2 accumulation steps.
    code, _, err = _run(["export", *SMALL, "--cpu", "--processes", "3", "--micro-batch", "4", "--global-batch", "24",
                         "--format", "trainer-args", "-o", "args.json"], capsys)
    assert code == 0, err
    import json
    args = json.loads((tmp_path / "args.json").read_text())
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"], args["use_cpu"]) == (4, 2, True)
    assert (args["bf16"], args["fp16"]) == (False, False)


def test_gpus_with_cpu_is_reported_ignored(no_gpu, capsys):
    code, _, err = _run(["export", *SMALL, "--gpus", "8xH100", "--cpu", "-o", "cpu.yaml"], capsys)
    assert code == 0, err
    assert "--gpus ignored with --cpu" in err


def test_processes_without_cpu_is_reported_ignored(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["export", *SMALL, "--gpus", "2xA100", "--processes", "3", "-o", "gpu.yaml"], capsys)
    assert code == 0, err
    assert "--processes" in err and "ignored without --cpu" in err
    assert yaml.safe_load((tmp_path / "gpu.yaml").read_text())["num_processes"] == 2


def test_cpu_refuses_a_strategy_it_cannot_run(no_gpu, capsys):
    code, _, err = _run(["export", *SMALL, "--cpu", "--strategy", "zero3", "-o", "x.yaml"], capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("advisor: error: --cpu makes a gloo test config for ddp only")


def test_launch_cpu_without_gpus_runs_the_processes_asked_for(no_gpu, tmp_path, capsys):
    (tmp_path / "train.py").write_text("")  # launch refuses a script that is not there
    code, _, err = _run(["launch", *SMALL, "--cpu", "--processes", "3", "train.py"], capsys)
    assert code == 0, err
    assert no_gpu == [["accelerate", "launch", "--config_file", "accelerate_config.yaml", "train.py"]]
    assert yaml.safe_load((tmp_path / "accelerate_config.yaml").read_text())["num_processes"] == 3


def test_refusal_names_only_options_that_exist():
    refusal = launch_module.cuda_refusal({"distributed_type": "FSDP", "num_processes": 2}, None)
    named = set(re.findall(r"--[a-z][a-z-]*", refusal))
    options = {opt for param in launch_command.params for opt in param.opts}
    assert named and named <= options, named - options
