"""DeepSpeed JSON, torchrun, TrainingArguments and Lightning exports, checked by their consumers."""

from __future__ import annotations

import json

import pytest
from export_plans import PLANS, make_plan

from advisor.export import FORMATS, ExportOptions, export_text, get_format, resolve_target
from advisor.export.deepspeed import build_deepspeed
from advisor.export.torchrun import build_torchrun
from advisor.export.trainer import build_trainer_args
from advisor.export.write import write_export


def test_registry_names_every_format_once():
    assert list(FORMATS) == ["accelerate", "deepspeed-json", "torchrun", "trainer-args", "lightning", "torchtitan"]
    assert len({f.default_filename for f in FORMATS.values()}) == len(FORMATS)
    with pytest.raises(ValueError, match="unknown export format"):
        get_format("yaml")


# --- DeepSpeed JSON -------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy,stage,opt_dev,param_dev", [
    ("ddp", 0, "none", "none"), ("zero1", 1, "none", "none"), ("zero2", 2, "none", "none"),
    ("zero3", 3, "none", "none"), ("zero2_offload", 2, "cpu", "none"), ("zero3_offload", 3, "cpu", "cpu"),
])
def test_deepspeed_json_loads_into_accelerates_deepspeed_plugin(tmp_path, strategy, stage, opt_dev, param_dev):
    # DeepSpeedPlugin(hf_ds_config=path) parses the file without importing deepspeed (accelerate 1.15).
    from accelerate.utils import DeepSpeedPlugin

    plan = make_plan("Qwen/Qwen2.5-0.5B", engine="deepspeed", strategy=strategy, global_batch_size=16)
    path = write_export(tmp_path / "ds_config.json", export_text(plan, "deepspeed-json")[0])
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    devices = (plugin.offload_optimizer_device, plugin.offload_param_device)
    assert (plugin.zero_stage, *devices) == (stage, opt_dev, param_dev)
    assert plugin.hf_ds_config.is_zero3() is (stage == 3)
    assert plugin.zero3_init_flag is (stage == 3)
    doc = json.loads(path.read_text())
    rec = plan.recommendation
    assert doc["train_micro_batch_size_per_gpu"] == rec.micro_batch_size
    assert doc["gradient_accumulation_steps"] == rec.gradient_accumulation_steps
    assert doc["train_batch_size"] == 16  # micro x accumulation x world is the global batch
    assert doc["bf16"] == {"enabled": True} and doc["fp16"] == {"enabled": False}


def test_deepspeed_json_from_a_torch_plan_is_refused_not_re_estimated():
    # It used to re-run the estimator on the DeepSpeed engine and write what that found; the plan had no
    # DeepSpeed candidate, so nothing the user saw. Now the format's own recipe plans it (the CLI's default).
    plan = make_plan(**PLANS["qwen7b_2xa100_zero3"])
    with pytest.raises(ValueError, match="runs only DeepSpeed; the plan used engine torch: plan it with --recipe "
                                         "deepspeed"):
        resolve_target(plan, "deepspeed-json")
    deepspeed = make_plan(**PLANS["qwen7b_2xa100_zero3"], recipe="deepspeed")
    target = resolve_target(deepspeed, "deepspeed-json")
    rec = deepspeed.recommendation
    assert (target.strategy, target.engine, target.micro_batch_size) == (rec.strategy, "deepspeed", rec.micro_batch_size)
    assert not any("instead" in note for note in target.notes)
    assert build_deepspeed(deepspeed)["zero_optimization"]["stage"] == 3


def test_deepspeed_fp16_has_a_dynamic_loss_scale():
    doc = build_deepspeed(make_plan("Qwen/Qwen2.5-0.5B", engine="deepspeed", precision="fp16-mixed"))
    assert doc["fp16"]["enabled"] and doc["fp16"]["loss_scale"] == 0 and not doc["bf16"]["enabled"]


# --- torchrun -------------------------------------------------------------------------------------

def test_torchrun_command_parses_with_torchruns_own_parser():
    from torch.distributed.run import get_args_parser

    plan = make_plan(**PLANS["qwen7b_2xa100_zero3"])
    argv = build_torchrun(plan, ExportOptions(script="train.py", script_args=("--lr", "1e-4")))
    assert argv[:5] == ["torchrun", "--nproc-per-node", "2", "--nnodes", "1"]
    args = get_args_parser().parse_args(argv[1:])
    assert (args.nproc_per_node, args.nnodes, args.standalone) == ("2", "1", True)
    assert (args.training_script, args.training_script_args) == ("train.py", ["--lr", "1e-4"])


def test_torchrun_two_nodes_uses_static_rendezvous_placeholders(capsys):
    from torch.distributed.run import get_args_parser

    argv = build_torchrun(make_plan(**PLANS["qwen72b_2nodes"]))
    assert argv[argv.index("--node-rank") + 1] == "<MACHINE_RANK>"
    assert argv[argv.index("--master-addr") + 1] == "<MAIN_NODE_IP>"
    with pytest.raises(SystemExit):  # torchrun itself refuses the unfilled node rank
        get_args_parser().parse_args(argv[1:])
    filled = [{"<MACHINE_RANK>": "1", "<MAIN_NODE_IP>": "10.0.0.1"}.get(a, a) for a in argv]
    args = get_args_parser().parse_args(filled[1:])
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("8", "2", 1)
    assert (args.master_addr, args.master_port) == ("10.0.0.1", 29500)


# --- TrainingArguments ----------------------------------------------------------------------------

def test_trainer_args_are_accepted_by_training_arguments(tmp_path):
    from transformers import TrainingArguments

    for name in ("qwen7b_2xa100_zero3", "qwen05b_ddp"):
        doc = build_trainer_args(make_plan(**PLANS[name]))
        doc["bf16"] = False  # this test machine has no bf16-capable GPU
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **doc)
        assert args.per_device_train_batch_size == doc["per_device_train_batch_size"]
        if name == "qwen7b_2xa100_zero3":
            plugin = args.fsdp_plugin_args
            assert plugin["fsdp_version"] == 2 and plugin["reshard_after_forward"] is True
            assert plugin["transformer_cls_names_to_wrap"] == "Qwen2DecoderLayer"
            assert plugin["state_dict_type"] == "SHARDED_STATE_DICT"


def test_trainer_args_for_deepspeed_inline_the_deepspeed_config():
    # TrainingArguments(deepspeed=...) needs deepspeed installed; check keys against its fields instead.
    import dataclasses

    from transformers import TrainingArguments

    plan = make_plan(**PLANS["qwen7b_deepspeed_zero2_offload"])
    doc = build_trainer_args(plan)
    assert set(doc) <= {f.name for f in dataclasses.fields(TrainingArguments)}
    assert doc["deepspeed"] == build_deepspeed(plan)
    assert doc["per_device_train_batch_size"] == doc["deepspeed"]["train_micro_batch_size_per_gpu"]


def test_the_format_table_is_the_one_list():
    # One row per format: the CLI's --format choices, the renderers and the recipes all come from it.
    from advisor.cli.export import export
    from advisor.export.formats import FORMAT_TABLE
    from advisor.recipes import load_recipes

    choices = next(p for p in export.params if p.name == "fmt").type.choices
    assert tuple(choices) == tuple(row.name for row in FORMAT_TABLE) == tuple(FORMATS)
    assert {row.name: row.recipe for row in FORMAT_TABLE} == {
        "accelerate": "trainer", "deepspeed-json": "deepspeed", "torchrun": "torch", "trainer-args": "trainer",
        "lightning": "lightning", "torchtitan": "torchtitan"}
    assert all(row.recipe in load_recipes() for row in FORMAT_TABLE)


@pytest.mark.parametrize("optimizer,impl,optim", [
    # Hand-read from transformers 5.23 trainer_optimizer.py (_get_adamw_torch: fused=True only for
    # adamw_torch_fused; adamw_torch is torch.optim.AdamW's default, foreach on CUDA) and OptimizerNames.
    ("adamw", "fused", {"optim": "adamw_torch_fused"}),
    ("adamw", "foreach", {"optim": "adamw_torch"}),
    ("adamw", "for-loop", {}),
    ("adam", "fused", {}),
    ("sgd-momentum", "foreach", {"optim": "sgd", "optim_args": "momentum=0.9"}),
    ("adamw-8bit", "fused", {"optim": "adamw_bnb_8bit"}),
])
def test_trainer_optim_is_the_plans_optimizer_step(optimizer, impl, optim):
    from transformers import TrainingArguments
    from transformers.training_args import OptimizerNames

    plan = make_plan("Qwen/Qwen2.5-0.5B", optimizer=optimizer, optimizer_impl=impl, recipe="trainer")
    target = resolve_target(plan, "trainer-args")
    doc = build_trainer_args(plan)
    assert {k: doc[k] for k in ("optim", "optim_args") if k in doc} == optim
    if optim:
        assert OptimizerNames(optim["optim"])
        assert TrainingArguments(output_dir="out", use_cpu=True, optim=optim["optim"]).optim == optim["optim"]
    else:  # no optim name: the note says to hand the Trainer the optimizer
        assert any("Trainer(optimizers=(optimizer, None))" in note for note in target.notes)


def test_cli_export_plans_each_format_with_its_recipe():
    from click.testing import CliRunner

    from advisor.cli.main import cli

    def export(*args):
        result = CliRunner().invoke(cli, ["export", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "-o", "-", *args])
        assert result.exit_code == 0, result.output
        return result

    trainer = export("--format", "trainer-args")
    assert json.loads(trainer.stdout)["optim"] == "adamw_torch_fused"  # recipe trainer: fused AdamW
    assert "Planned with recipe" not in trainer.stderr
    torch = export("--format", "trainer-args", "--recipe", "torch")  # the user's recipe wins, and is named
    assert json.loads(torch.stdout)["optim"] == "adamw_torch"
    assert "Planned with recipe torch; the trainer-args file runs the trainer stack" in torch.stderr
    assert "recipe lightning, foreach step" in export("--format", "lightning").stdout
