"""The `advisor plan` invocations whose output is kept under tests/planning/golden/ (shared by the test and
the update script, so the two cannot drift). Regenerate after an intended change with
`python tests/planning/update_plan_golden.py` and review `git diff tests/planning/golden`."""

from __future__ import annotations

from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"

CASES = {
    "plan_qwen7b_2xa100.txt": ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100"],
    "plan_qwen7b_2xa100.json": ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "--json"],
    "plan_llama70b_2x8xh100_fastest.txt": ["plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "2x8xH100",
                                           "--policy", "fastest", "--global-batch", "64"],
    "plan_405b_8xa100_nothing_fits.txt": ["plan", "--model", "meta-llama/Llama-3.1-405B", "--gpus", "8xA100",
                                          "--cpu-memory-gib", "1024"],
    "plan_gpt2_deepspeed_sgd.json": ["plan", "--model", "openai-community/gpt2", "--gpus", "4xA10G",
                                     "--engine", "deepspeed", "--optimizer", "sgd-momentum", "--json"],
}


def run_case(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    from advisor.cli.main import cli

    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output
