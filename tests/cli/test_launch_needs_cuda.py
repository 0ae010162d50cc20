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


def test_dry_run_refuses_the_config_paths_the_launch_refuses(launched, monkeypatch, capsys, tmp_path):
    """--dry-run approved a directory, a FIFO, a path in a missing directory and a link (it said the link 'needs
    --force', and the launch with --force refused it with a hint, '-o - for stdout', naming an option launch lacks)."""
    import os

    _no_gpu(monkeypatch)
    (tmp_path / "exp").mkdir()
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "mine.yaml").write_text("mine\n")
    (tmp_path / "link.yaml").symlink_to("mine.yaml")
    cases = {"exp": "--config-file exp: exp names a directory; give a file name, e.g. exp/accelerate_config.yaml",
             "fifo.yaml": "--config-file fifo.yaml: fifo.yaml exists and is not a regular file (a pipe, device or "
                          "terminal); give a file name",
             "nodir/x.yaml": "--config-file nodir/x.yaml: directory nodir does not exist",
             "link.yaml": "--config-file link.yaml: link.yaml is a symbolic link; give the file it points to"}
    job = ["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--processes", "1"]
    for name, said in cases.items():
        for extra in (["--dry-run"], ["--force"]):  # the same refusal, dry or not
            code, out, err = _run([*job, *extra, "--config-file", name, "train.py"], capsys)
            assert code == 2 and out == "" and err == f"advisor: error: {said}\n", (name, extra, err)
    assert launched == [] and (tmp_path / "link.yaml").is_symlink() and (tmp_path / "mine.yaml").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "fifo.yaml", "link.yaml", "mine.yaml", "train.py"]


def test_a_script_that_is_a_directory_is_named_as_one(launched, monkeypatch, capsys, tmp_path):
    """The dry run said 'exp: no such file here' of a directory."""
    _no_gpu(monkeypatch)
    (tmp_path / "exp").mkdir()
    job = ["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--processes", "1"]
    code, out, err = _run([*job, "--dry-run", "exp"], capsys)
    assert code == 0 and out.strip().endswith("accelerate_config.yaml exp")
    assert "advisor: note: exp: a directory, not a file; advisor launch checks it before writing anything\n" in err
    code, out, err = _run([*job, "exp"], capsys)
    assert code == 2 and launched == []
    assert err == "advisor: error: exp: a directory, not a file (the training script advisor launch runs)\n"


def test_dry_run_over_a_config_holding_this_plan_needs_no_force(launched, monkeypatch, capsys, tmp_path):
    """The dry run compared the file with the parsed config (a dict), so it always said 'needs --force'; the launch
    keeps a file that already holds the text it writes."""
    _no_gpu(monkeypatch)
    job = ["launch", "--model", "Qwen/Qwen2.5-0.5B", "--cpu", "--processes", "1"]
    assert _run([*job, "train.py"], capsys)[0] == 0 and len(launched) == 1
    code, _, err = _run([*job, "--dry-run", "train.py"], capsys)
    assert code == 0 and "advisor launch writes accelerate_config.yaml (advisor export -o - shows it)\n" in err
    (tmp_path / "accelerate_config.yaml").write_text("mine\n")
    code, _, err = _run([*job, "--dry-run", "train.py"], capsys)
    assert code == 0 and "which exists with other contents: the launch needs --force to overwrite it\n" in err
