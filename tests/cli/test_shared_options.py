"""Every command that plans takes every plan option: an export is the plan ``advisor plan`` showed."""

from __future__ import annotations

import json
import typing

import click
import pytest
import yaml
from click.testing import CliRunner

from advisor.cli.main import cli
from advisor.precision import PRECISIONS
from advisor.strategies import STRATEGIES
from advisor.training import Policy

# Qwen2.5-0.5B on 2 x A100: thresholds keeps DDP (micro-batch 10); fastest picks zero2 at micro-batch
# 11 (`advisor plan ... --policy fastest`, checked by hand against the plan table). The two policies
# disagree here, so an export that ignored --policy would show.
SMALL = ["--model", "Qwen/Qwen2.5-0.5B", "--gpus", "2xA100"]


def _plan_json(*extra: str) -> dict:
    result = CliRunner().invoke(cli, ["plan", *SMALL, "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["recommendation"]


def test_export_policy_fastest_exports_the_plan_policy_fastest_chose(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fastest, thresholds = _plan_json("--policy", "fastest"), _plan_json()
    assert (fastest["strategy"], thresholds["strategy"]) == ("zero2", "ddp")
    result = CliRunner().invoke(cli, ["export", *SMALL, "--policy", "fastest", "-o", "-"])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.stdout)
    # zero2 on torch is FSDP2 without resharding after forward.
    assert doc["distributed_type"] == "FSDP" and doc["fsdp_config"]["fsdp_reshard_after_forward"] is False
    assert f"micro-batch {fastest['micro_batch_size']} of 2,048 tokens," in result.stdout.splitlines()[0]  # the default length


def _command(name: str) -> click.Command:
    """A subcommand as the CLI resolves it (compare, simulate, export and launch load when named)."""
    return cli.get_command(click.Context(cli), name)


@pytest.mark.parametrize("command", ["plan", "simulate", "compare", "export", "launch"])
def test_every_planning_command_has_the_same_plan_options(command):
    plan_params = {p.name for p in _command("plan").params if isinstance(p, click.Option)}
    params = {p.name for p in _command(command).params}
    shared = plan_params - {"as_json", "verify", "chart_file", "force", "verbose"}  # output options of `plan`, not plan options
    assert "policy" in shared and shared <= params


def _choices(name: str) -> tuple[str, ...]:
    option = next(p for p in _command("export").params if p.name == name)
    return tuple(option.type.choices)


def test_choices_are_the_tables():
    assert _choices("strategy") == tuple(STRATEGIES)
    assert _choices("precision") == tuple(PRECISIONS)
    assert _choices("policy") == typing.get_args(Policy) == ("thresholds", "fastest")
