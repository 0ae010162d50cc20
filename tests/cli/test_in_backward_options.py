"""``--optimizer-in-backward`` and ``--optimizer adamw-8bit-paged`` through the in-process CLI: what cannot
be planned is one line on stderr and exit 2; a plan that uses neither keeps its JSON (no new key)."""

from __future__ import annotations

import json

import pytest

from tests.cli._main import run_main

PLAN = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--optimizer-in-backward"]


@pytest.mark.parametrize("args, says", [
    (["--gpus", "2xA100"], "one GPU only"),
    (["--gpus", "1xA100", "--global-batch", "4", "--micro-batch", "2"], "cannot accumulate gradients"),
    (["--gpus", "1xA100", "--engine", "deepspeed"], "torch engine"),
    (["--gpus", "1xA100", "--strategy", "zero3"], "plain model of one GPU"),
])
def test_refusals_are_one_line_exit_2(capsys, args, says):
    code, out, err = run_main([*PLAN, *args], capsys)
    assert code == 2, (args, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and says in err, err


def test_plan_with_both_lists_them_in_json_and_assumptions(capsys):
    code, out, _ = run_main([*PLAN, "--gpus", "1xRTX4090", "--optimizer", "adamw-8bit-paged", "--json"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert plan["training"]["optimizer_in_backward"] is True and plan["training"]["optimizer"] == "adamw-8bit-paged"
    assert any("optimizer in backward" in note for note in plan["assumptions"])
    assert any("PagedAdamW8bit" in note for note in plan["assumptions"])
    by_name = {c["strategy"]: c for c in plan["candidates"]}
    assert by_name["ddp"]["available"] and not by_name["zero3"]["available"]


def test_default_plan_has_no_new_key(capsys):
    code, out, _ = run_main(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xA100", "--json"], capsys)
    assert code == 0
    assert "optimizer_in_backward" not in out and "paged_on_cpu" not in out


@pytest.mark.parametrize("optim, ours", [("paged_adamw_8bit", "adamw-8bit-paged"), ("adamw_bnb_8bit", "adamw-8bit"),
                                         ("paged_adamw_32bit", "adamw")])
def test_trainer_paged_optimizer_names_map_to_ours(optim, ours):
    """transformers' OptimizerNames: ``paged_adamw_8bit`` is bitsandbytes' PagedAdamW8bit (trainer_optimizer.py),
    read by the Trainer callback and by --from as adamw-8bit-paged; ``adamw_bnb_8bit`` stays unpaged;
    ``paged_adamw_32bit`` keeps AdamW's fp32 state (PagedAdamW32bit, stepped in place: fused's memory)."""
    from types import SimpleNamespace

    from advisor.planning.config_trainer import TRAINER_OPTIM
    from wrappers.callbacks import _hf_optimizer

    assert _hf_optimizer(SimpleNamespace(optim=optim)) == ours
    assert TRAINER_OPTIM[optim][0] == ours
    if optim == "paged_adamw_32bit":
        from wrappers.callbacks import _hf_optimizer_impl

        assert _hf_optimizer_impl(SimpleNamespace(optim=optim)) == "fused"
