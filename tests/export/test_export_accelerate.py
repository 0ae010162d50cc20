"""The accelerate YAML: reloaded by accelerate's own loader, read by its launcher and plugins."""

from __future__ import annotations

import json

import os

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
from export_plans import PLANS, make_plan

from advisor.export import ExportOptions, resolve_target
from advisor.export.accelerate import build_accelerate, render_accelerate
from advisor.export.write import write_export
from advisor.model.sources import resolve_size
from advisor.mesh import ParallelDims
from advisor.strategies import STRATEGIES

SMALL = "Qwen/Qwen2.5-0.5B"  # every strategy fits on 2 x A100, so each one can be requested
PAIRS = [(s, e) for s in STRATEGIES for e in ("torch", "deepspeed") if STRATEGIES[s].on(e).available]
# accelerate's distributed_type for each available (strategy, engine), by hand: the torch engine's
# sharded strategies are FSDP; DDP is MULTI_GPU, and so are DataParallel and ZeRO-1, which accelerate
# has no torch form of (exported as DDP, with a note); anything on DeepSpeed is DEEPSPEED.
DISTRIBUTED_TYPE = {
    ("dp", "torch"): "MULTI_GPU", ("ddp", "torch"): "MULTI_GPU", ("zero1", "torch"): "MULTI_GPU",
    ("zero2", "torch"): "FSDP", ("zero3", "torch"): "FSDP", ("zero2_offload", "torch"): "FSDP",
    ("zero3_offload", "torch"): "FSDP",
    **{(s, "deepspeed"): "DEEPSPEED" for s in ("ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")},
}


def test_every_available_pair_has_a_hand_written_distributed_type():
    assert sorted(PAIRS) == sorted(DISTRIBUTED_TYPE)


def _write(tmp_path, plan, options=None, name="accelerate_config.yaml"):
    return write_export(tmp_path / name, render_accelerate(plan, options))


def _fill_placeholders(path):
    text = path.read_text().replace("<MACHINE_RANK>", "0").replace("<MAIN_NODE_IP>", "10.0.0.1")
    path.write_text(text)


def _launcher_env(path):
    """What `accelerate launch --config_file path` would export to the workers (no process started). The port is
    a free one: accelerate checks that its port is unused, and under pytest-xdist a real two-process launch in
    another worker may hold the config's 29500 at that moment."""
    from tests.wrappers._dist import free_port

    args = launch_command_parser().parse_args(["--config_file", str(path), "--main_process_port", str(free_port()),
                                               "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return args, prepare_deepspeed_cmd_env(args)[1]
    return args, prepare_multi_gpu_env(args)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("strategy,engine", PAIRS)
def test_every_strategy_round_trips_through_accelerates_loader(tmp_path, strategy, engine, nodes):
    if strategy == "dp" and nodes > 1:  # DataParallel is one process: pinning it over nodes is bad input
        with pytest.raises(ValueError, match="one node only"):
            make_plan(SMALL, "8xA100", nodes=nodes, strategy=strategy, engine=engine)
        return
    plan = make_plan(SMALL, "8xA100" if nodes > 1 else "2xA100", nodes=nodes if nodes > 1 else None,
                     strategy=strategy, engine=engine)
    if (strategy, engine) in {("dp", "torch"), ("zero1", "torch")}:  # pinned, so the plan has nothing else to write
        with pytest.raises(ValueError, match="has no accelerate config.*plan it with --strategy ddp$"):
            build_accelerate(plan)
        return
    built = build_accelerate(plan)
    loaded = load_config_from_file(str(_write(tmp_path, plan)))
    assert isinstance(loaded, ClusterConfig)
    as_dict = loaded.to_dict()
    for key, value in built.items():
        assert as_dict[key] == value, key
    assert (loaded.num_processes, loaded.num_machines) == ((16, 2) if nodes > 1 else (2, 1))
    assert loaded.distributed_type == DISTRIBUTED_TYPE[strategy, engine]


def test_fsdp2_config_is_what_accelerates_fsdp_plugin_reads(tmp_path, monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin

    plan = make_plan(**PLANS["qwen7b_2xa100_zero3"])
    args, env = _launcher_env(_write(tmp_path, plan))
    assert args.use_fsdp and int(args.num_processes) == 2 and args.mixed_precision == "bf16"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    assert plugin.transformer_cls_names_to_wrap == ["Qwen2DecoderLayer"]
    assert plugin.activation_checkpointing is False
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"
    assert type(plugin.cpu_offload).__name__ == "OffloadPolicy"  # the no-offload policy


@pytest.mark.parametrize("strategy,reshard,offload", [("zero2", False, False), ("zero3_offload", True, True)])
def test_fsdp_flags_follow_the_strategy_table(tmp_path, monkeypatch, strategy, reshard, offload):
    from accelerate.utils import FullyShardedDataParallelPlugin

    plan = make_plan(SMALL, strategy=strategy, activation_checkpointing="on")
    for key, value in _launcher_env(_write(tmp_path, plan))[1].items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.reshard_after_forward is reshard
    assert (type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") is offload
    assert plugin.activation_checkpointing is True


def test_deepspeed_config_is_what_accelerates_deepspeed_plugin_reads(tmp_path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    plan = make_plan(**PLANS["qwen7b_deepspeed_zero2_offload"])
    args, env = _launcher_env(_write(tmp_path, plan))
    assert args.use_deepspeed
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.offload_optimizer_device, plugin.offload_param_device) == (2, "cpu", "none")
    assert plugin.gradient_accumulation_steps == 1 and plugin.zero3_init_flag is False


def test_two_nodes_have_marked_placeholders_that_accelerate_refuses_until_filled(tmp_path):
    plan = make_plan(**PLANS["qwen72b_2nodes"])
    path = _write(tmp_path, plan)
    text = path.read_text()
    assert "main_process_ip: <MAIN_NODE_IP>  # FILL IN" in text
    assert "machine_rank: <MACHINE_RANK>  # FILL IN" in text
    loaded = load_config_from_file(str(path))
    assert (loaded.num_machines, loaded.num_processes, loaded.rdzv_backend) == (2, 16, "static")
    with pytest.raises(ValueError, match="MACHINE_RANK"):
        _launcher_env(path)
    _fill_placeholders(path)
    args, env = _launcher_env(path)
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "8", 0)


def test_two_node_export_writes_the_plan_not_its_own_hybrid_sharding():
    # The export used to switch to HSDP (2 x 8) by its own rule whenever one node's share "fit" at the
    # expected estimate (ignoring --margin): for 72B it wrote a hybrid-sharded zero3_offload the plan never
    # evaluated (with --hybrid 2 nothing fits: 24 GPUs would), for 7B an HSDP zero2 where the plan chose
    # zero2 over all 16 GPUs. Now the export writes the plan's strategy and mesh.
    for args in (PLANS["qwen72b_2nodes"], dict(model="Qwen/Qwen2.5-7B", gpus="8xH100", nodes=2)):
        plan = make_plan(**args)
        assert plan.recommendation.mesh is None
        target = resolve_target(plan, "accelerate")
        assert (target.strategy, target.hybrid, target.mesh) == (plan.recommendation.strategy, False, None)
        doc = build_accelerate(plan)
        assert "parallelism_config" not in doc and doc["num_processes"] == 16
    # --policy fastest evaluates the HSDP mesh and chooses dp 16: the export keeps that choice too.
    fastest = make_plan("Qwen/Qwen2.5-7B", "8xH100", nodes=2, policy="fastest")
    assert any(c.mesh is not None and c.mesh.dp_replicate == 2 for c in fastest.candidates)
    assert fastest.recommendation.mesh is None and not resolve_target(fastest, "accelerate").hybrid


def test_hybrid_plan_exports_its_mesh(tmp_path, monkeypatch):
    from accelerate.parallelism_config import ParallelismConfig

    plan = make_plan("Qwen/Qwen2.5-7B", "8xH100", nodes=2, hybrid=2)  # --hybrid 2 pins HSDP in the plan
    assert plan.recommendation.mesh == ParallelDims(dp_replicate=2, dp_shard=8, world_size=16)
    target = resolve_target(plan, "accelerate")
    assert (target.strategy, target.mesh, target.hybrid) == (plan.recommendation.strategy, plan.recommendation.mesh,
                                                             True)
    path = _write(tmp_path, plan)
    _fill_placeholders(path)
    for key, value in _launcher_env(path)[1].items():
        monkeypatch.setenv(key, value)
    config = ParallelismConfig()
    assert (config.dp_replicate_size, config.dp_shard_size, config.total_size) == (2, 8, 16)
    assert resolve_target(plan, "accelerate", ExportOptions(hybrid="on")).hybrid
    with pytest.raises(ValueError, match="--hybrid off: the plan chose mesh dp_replicate 2 x dp_shard 8"):
        resolve_target(plan, "accelerate", ExportOptions(hybrid="off"))


def test_hybrid_switch_checks_the_plan_and_never_decides():
    plan = make_plan(**PLANS["qwen72b_2nodes"])
    with pytest.raises(ValueError, match="not hybrid-sharded.*--hybrid 2"):
        resolve_target(plan, "accelerate", ExportOptions(hybrid="on"))
    assert "parallelism_config" not in build_accelerate(plan, ExportOptions(hybrid="off"))
    # one node: the example is two replicas of half the node each (it said --hybrid 1, which is no replica)
    one_node = make_plan("meta-llama/Llama-3.1-8B", "8xH100")
    with pytest.raises(ValueError, match=r"not hybrid-sharded.*--hybrid 2: 2 replicas, each sharding over 4 GPUs"):
        resolve_target(one_node, "accelerate", ExportOptions(hybrid="on"))
    assert make_plan("meta-llama/Llama-3.1-8B", "8xH100", hybrid=2).recommendation.mesh.dp_replicate == 2
    with pytest.raises(ValueError, match="3 GPUs on one node split into no replicas .*: leave --hybrid out"):
        resolve_target(make_plan("Qwen/Qwen2.5-0.5B", "3xA100"), "accelerate", ExportOptions(hybrid="on"))


def test_cpu_config_for_ddp_and_refused_for_sharded(tmp_path):
    doc = build_accelerate(make_plan(SMALL), ExportOptions(cpu=True))
    # MULTI_GPU: accelerate starts one process per rank through torch.distributed.run; MULTI_CPU
    # would start a single process without mpirun.
    assert (doc["distributed_type"], doc["use_cpu"], doc["mixed_precision"]) == ("MULTI_GPU", True, "no")
    assert load_config_from_file(str(_write(tmp_path, make_plan(SMALL), ExportOptions(cpu=True)))).use_cpu
    # A plan that chose zero3 by itself still gives the DDP test config (it is not the GPU plan);
    # a strategy or engine the user asked for that CPU DDP cannot run is refused.
    assert build_accelerate(make_plan(**PLANS["qwen7b_2xa100_zero3"]), ExportOptions(cpu=True))["distributed_type"] \
        == "MULTI_GPU"
    with pytest.raises(ValueError, match="--cpu makes a gloo test config for ddp only.*not --strategy zero3"):
        build_accelerate(make_plan(SMALL, strategy="zero3"), ExportOptions(cpu=True))
    with pytest.raises(ValueError, match="not --engine deepspeed"):
        build_accelerate(make_plan(SMALL, engine="deepspeed"), ExportOptions(cpu=True))


@pytest.mark.parametrize("precision,expected", [("bf16-mixed", "bf16"), ("fp16-mixed", "fp16"), ("fp32", "no"),
                                                ("bf16", "bf16")])
def test_mixed_precision_follows_the_plan(precision, expected):
    assert build_accelerate(make_plan(SMALL, precision=precision))["mixed_precision"] == expected


def test_size_only_model_wraps_by_size(tmp_path, monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin

    plan = make_plan(resolve_size("3B"), strategy="zero3")
    fsdp = build_accelerate(plan)["fsdp_config"]
    assert fsdp["fsdp_auto_wrap_policy"] == "SIZE_BASED_WRAP" and "fsdp_transformer_layer_cls_to_wrap" not in fsdp
    for key, value in _launcher_env(_write(tmp_path, plan))[1].items():
        monkeypatch.setenv(key, value)
    assert FullyShardedDataParallelPlugin().min_num_params == 100_000_000


def test_nothing_fits_is_refused_naming_the_smallest_fit():
    plan = make_plan("Qwen/Qwen2.5-7B", "2xA100", strategy="zero1")
    assert plan.recommendation is None
    with pytest.raises(ValueError) as err:
        build_accelerate(plan)
    message = str(err.value)
    # zero1 was pinned, so the other strategies were first tried on these GPUs: zero3 with CPU offload fits there
    # (the torch recipe's foreach AdamW leaves zero3 alone 0.4 GiB short on two A100s)
    assert message == ("zero1 does not fit on 2 x A100-80GB-SXM for Qwen/Qwen2.5-7B, so there is nothing to export: "
                       "zero3_offload fits on these 2 x A100-80GB-SXM at micro-batch 1. Without offload, "
                       "3 x A100-80GB-SXM would fit with zero3 at micro-batch 1.")
    assert "\n" not in message and os.linesep not in message
    unpinned = make_plan("Qwen/Qwen2.5-72B", "1xA10G", activation_checkpointing="on")
    with pytest.raises(ValueError) as err:
        build_accelerate(unpinned)
    assert str(err.value).startswith("nothing fits 1 x A10G for Qwen/Qwen2.5-72B") and "would fit" in str(err.value)


def test_llava_wraps_the_language_and_vision_blocks(tmp_path, monkeypatch):
    """Llava: accelerate's FSDP plugin reads both block classes from the one comma-separated key (its
    dataclasses.py splits on ','), and the Trainer arguments list both."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    from advisor.export.trainer import build_trainer_args

    plan = make_plan("llava-hf/llava-1.5-7b-hf", strategy="zero3", images_per_sample=1)
    _, env = _launcher_env(_write(tmp_path, plan))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert FullyShardedDataParallelPlugin().transformer_cls_names_to_wrap == ["LlamaDecoderLayer", "CLIPEncoderLayer"]
    args = build_trainer_args(plan)
    assert args["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer", "CLIPEncoderLayer"]


def test_a_zero3_file_on_deepspeeds_defaults_names_overlap_on_and_the_command_that_shows_its_plan(tmp_path, capsys,
                                                                                                   monkeypatch):
    """A review: the note said overlap_comm false of a ZeRO-3 file (DeepSpeed resolves an unset overlap_comm to
    stage == 3, profiles/zero_defaults.json) and sent the user to `advisor plan --recipe trainer`, which plans our own
    buckets, not the accelerate defaults this file runs and the export planned; `--from` the file reproduces it."""
    from tests.cli._main import run_main

    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["export", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "2x8xH100", "--engine",
                               "deepspeed", "-o", "ds.yaml"], capsys)
    assert code == 0, err
    assert "zero3 on deepspeed" in out and "overlap_comm true" in err and "overlap_comm false" not in err
    assert "advisor plan --from ds.yaml ... shows this plan" in err
    code, exported, _ = run_main(["plan", "--from", "ds.yaml", "--model", "meta-llama/Llama-3.1-70B", "--gpus",
                                  "2x8xH100", "--json"], capsys)
    from advisor.export.formats import format_plan_options
    from advisor.planning.api import plan

    planned = plan(**format_plan_options("accelerate", dict(model="meta-llama/Llama-3.1-70B", gpus="2x8xH100",
                                                           engine="deepspeed")))
    doc = json.loads(exported)
    assert code == 0 and doc["recommendation"]["strategy"] == planned.recommendation.strategy == "zero3"
    from_file = next(c for c in doc["candidates"] if c["strategy"] == "zero3")
    assert from_file["memory_bytes"]["total"] == planned.candidate("zero3").memory_bytes.total
