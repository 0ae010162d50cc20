"""``advisor launch`` refuses a GPU config on a machine with no GPU (exit 2, one line naming --cpu).

accelerate 1.15 does not fail there: every rank starts on the CPU without a process group and the
job exits 0 having trained unsynchronised. GPU detection (nvidia-smi) is stubbed; nothing is launched.
"""

from __future__ import annotations

import pytest

import advisor.export.launch as launch_module
import advisor.hardware.local_gpus as local_gpus_module
from tests.cli._main import run_main as _run

# --context-gib 0: zero3 fits 2 A100s only without the CUDA context on top (78.56 of 79.15 GiB;
# tests/planning/test_plan_cases.py), and the subject here is the launch check, not the fit.
ZERO3 = ["launch", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "--strategy", "zero3", "--context-gib", "0"]


@pytest.fixture
def launched(tmp_path, monkeypatch):
    """Run in tmp_path; record launches instead of running them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")  # launch refuses a script that is not there
    calls = []
    monkeypatch.setattr(launch_module, "run_launch", lambda command, **kw: calls.append(command) or 0)
    return calls


def _no_gpu(monkeypatch):
    monkeypatch.setattr(local_gpus_module, "detect_local_gpus", lambda **kw: None)


def test_fsdp_launch_without_a_gpu_is_refused_naming_cpu(launched, monkeypatch, capsys):
    _no_gpu(monkeypatch)
    code, out, err = _run([*ZERO3, "train.py"], capsys)
    assert code == 2 and launched == []
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor: error: this config runs FSDP on 2 CUDA GPUs")
    assert "--cpu" in lines[0] and "fp32" in lines[0] and "gloo" in lines[0]


def test_deepspeed_and_ddp_gpu_configs_are_refused_too(launched, monkeypatch, capsys):
    _no_gpu(monkeypatch)
    for extra, kind in ((["--engine", "deepspeed"], "DeepSpeed"), ([], "FSDP")):
        code, _, err = _run([*ZERO3, *extra, "--force", "train.py"], capsys)
        assert code == 2 and f"runs {kind} on 2 CUDA GPUs" in err
    code, _, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--strategy", "ddp",
                         "--force", "train.py"], capsys)
    assert code == 2 and "runs DDP on NCCL on 2 CUDA GPUs" in err
    assert launched == []


def test_dry_run_prints_the_command_and_says_it_would_be_refused(launched, monkeypatch, capsys):
    _no_gpu(monkeypatch)
    code, out, err = _run([*ZERO3, "--dry-run", "train.py"], capsys)
    assert code == 0 and launched == []
    assert out.strip().splitlines()[-1] == "accelerate launch --config_file accelerate_config.yaml train.py"
    assert "would refuse to run this here: this config runs FSDP" in err


def test_launch_goes_ahead_with_a_gpu(launched, monkeypatch, capsys):
    monkeypatch.setattr(local_gpus_module, "detect_local_gpus", lambda **kw: "2xNVIDIA A100-SXM4-80GB")
    code, _, err = _run([*ZERO3, "train.py", "--lr", "1e-4"], capsys)
    assert code == 0, err
    assert launched == [["accelerate", "launch", "--config_file", "accelerate_config.yaml", "train.py", "--lr", "1e-4"]]


def test_cpu_config_launches_without_a_gpu(launched, monkeypatch, capsys):
    _no_gpu(monkeypatch)
    code, _, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100", "--cpu", "train.py"], capsys)
    assert code == 0, err
    assert len(launched) == 1


def test_a_refused_launch_leaves_the_config_file_as_it_was(launched, monkeypatch, capsys, tmp_path):
    """Even with --force: the refusal comes before anything is written (issue 21, item 18)."""
    _no_gpu(monkeypatch)
    (tmp_path / "mine.yaml").write_text("the user's config\n")
    code, _, err = _run([*ZERO3, "--config-file", "mine.yaml", "--force", "train.py"], capsys)
    assert code == 2 and "runs FSDP on 2 CUDA GPUs" in err
    assert (tmp_path / "mine.yaml").read_text() == "the user's config\n"


def test_a_missing_script_is_refused_before_anything_is_written(launched, monkeypatch, capsys, tmp_path):
    _no_gpu(monkeypatch)
    code, _, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "nonexistent.py"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and launched == [] and len(lines) == 1 and "nonexistent.py: no such file" in lines[0]
    assert not (tmp_path / "accelerate_config.yaml").exists()


def test_dry_run_says_the_script_is_missing(launched, monkeypatch, capsys, tmp_path):
    """A dry run still prints the command, and says what the real launch would refuse: the missing script."""
    _no_gpu(monkeypatch)
    code, out, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--dry-run", "nonexistent.py"], capsys)
    assert code == 0 and launched == [] and out.strip().endswith("nonexistent.py")
    assert "nonexistent.py: no such file here" in err
    code, _, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--dry-run", "train.py"], capsys)
    assert code == 0 and "no such file" not in err


def test_dry_run_writes_nothing(launched, monkeypatch, capsys, tmp_path):
    """So that the README's next line, a launch with other options, does not meet a stale config."""
    _no_gpu(monkeypatch)
    code, out, _ = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--dry-run", "train.py"], capsys)
    assert code == 0 and out.strip().endswith("accelerate launch --config_file accelerate_config.yaml train.py")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
    code, _, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--processes", "3", "train.py"], capsys)
    assert code == 0, err


def test_accelerate_options_are_not_passed_through(launched, monkeypatch, capsys, tmp_path):
    """``--num_processes 4`` ran 4 processes against a plan for 2 (issue 21, item 10)."""
    _no_gpu(monkeypatch)
    code, _, err = _run(["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--num_processes", "4", "train.py"],
                        capsys)
    line = err.strip().splitlines()
    assert code == 2 and launched == [] and len(line) == 1 and "--num_processes 4: advisor launch does not pass" in line[0]
    assert not (tmp_path / "accelerate_config.yaml").exists()
