"""torchtitan job config (TOML) export, and the pp/ep refusals of the formats that cannot express them.

torchtitan is not installable here, so the written file is checked against the key table read by hand from
torchtitan's own ``torchtitan/config/job_config.py`` at v0.2.2 (commit 73a0e6979dd1, recorded in
``profiles/torchtitan_job_config.json``; torchtitan's ConfigManager rejects any key outside its dataclasses),
reloaded with ``tomllib``, and its schedule names resolved by the installed torch's own
``get_schedule_class``. Expected values are worked by hand from the plans' pins.
"""

from __future__ import annotations

import json
import tomllib

import pytest
from export_plans import PLANS, make_plan

from advisor.export import export_text
from advisor.planning.api import plan
from advisor.export.formats import FORMAT_TABLE
from advisor.export.torchtitan import build_torchtitan, torchtitan_keys

LLAMA = "meta-llama/Llama-3.1-8B"  # 32 layers, 8 KV heads
_TYPES = {"int": int, "str": str, "bool": bool, "list[str]": list}


def _pp_plan(schedule: str = "1f1b", **extra):
    # 2 nodes x 8 H100, pp 2 and tp 8 pinned (the search alone would take tp 2: faster), micro-batch 2, global
    # batch 32: dp 1, so the pipeline runs 32 / 2 = 16 micro-batches a step.
    return make_plan(LLAMA, "8xH100", nodes=2, pp=2, tp=8, pp_schedule=schedule, micro_batch_size=2,
                     global_batch_size=32, recipe="torchtitan", **extra)


def _check_keys(doc: dict) -> None:
    """Every section and key is one torchtitan 0.2.2 defines, of its type, within its choices."""
    table = torchtitan_keys()
    for section, keys in doc.items():
        assert section in table["keys"], section
        for key, value in keys.items():
            kind = table["keys"][section][key]
            if kind == "list[list[str]]":
                assert all(isinstance(name, str) for part in value for name in part)
            else:
                assert type(value) is _TYPES[kind], (section, key, value)
            choices = table["choices"].get(f"{section}.{key}")
            assert choices is None or value in choices, (section, key, value)


def _reloaded(plan) -> dict:
    text, _ = export_text(plan, "torchtitan")
    doc = tomllib.loads(text)
    assert doc == build_torchtitan(plan)  # what the file says is what was built
    _check_keys(doc)
    return doc


def test_schedule_table_agrees_with_torch():
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    from advisor.estimate.pipeline_schedules import load_schedules

    from wrappers.pipeline import SCHEDULES

    multi = set(torchtitan_keys()["multi_stage_schedules"])
    for facts in load_schedules().values():
        assert facts.torch_class == SCHEDULES[facts.name].class_name, facts.name  # wrap() runs the same class
        if facts.torch_class is None:  # zb_h2, zb_2p: torch has no class for them; the export refuses them
            with pytest.raises(ValueError, match="has no"):
                export_text(_pp_plan(facts.name), "torchtitan")
            continue
        cls = get_schedule_class(facts.torch_class.removeprefix("Schedule"))  # torchtitan's spelling resolves
        assert cls.__name__ == facts.torch_class
        assert issubclass(cls, PipelineScheduleMulti) == (facts.torch_class in multi), facts.torch_class


def test_data_parallel_plans_write_their_degrees():
    # zero3 on 2 A100s: FSDP over both ranks, the blocks resharded after forward and the norm + head unit kept, as
    # the torchtitan recipe plans: torchtitan's "default" without pp ("always" reshards that unit too, which the
    # reader of --from notes as not planned: a review found the export wrote it); ddp: two replicas, no sharding.
    zero3 = _reloaded(make_plan(**PLANS["qwen7b_2xa100_zero3"], recipe="torchtitan"))
    assert {k: zero3["parallelism"][k] for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                                 "fsdp_reshard_after_forward", "pipeline_parallel_degree")} \
        == {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2, "fsdp_reshard_after_forward": "default",
            "pipeline_parallel_degree": 1}
    assert zero3["optimizer"] == {"name": "AdamW", "implementation": "fused"}  # the torchtitan recipe's step
    ddp = _reloaded(make_plan(**PLANS["qwen05b_ddp"], recipe="torchtitan"))
    assert (ddp["parallelism"]["data_parallel_replicate_degree"], ddp["parallelism"]["data_parallel_shard_degree"]) \
        == (2, 1)
    assert "fsdp_reshard_after_forward" not in ddp["parallelism"]


def test_a_sharded_pipeline_plan_asks_always():
    """Under pp torchtitan's "default" keeps the blocks unsharded after forward: a zero3 stage asks "always"."""
    doc = _reloaded(make_plan(LLAMA, "8xH100", nodes=2, pp=2, tp=2, recipe="torchtitan"))
    assert (doc["parallelism"]["data_parallel_shard_degree"], doc["parallelism"]["fsdp_reshard_after_forward"]) == (
        4, "always")


def test_pipeline_plan_writes_its_stages_schedule_and_micro_batches():
    doc = _reloaded(_pp_plan())
    par, training = doc["parallelism"], doc["training"]
    assert (par["pipeline_parallel_degree"], par["pipeline_parallel_schedule"], par["tensor_parallel_degree"]) \
        == (2, "1F1B", 8)
    # 16 micro-batches of 2 per step on the one data-parallel rank: local batch 32 = global batch 32.
    assert (par["pipeline_parallel_microbatch_size"], training["local_batch_size"], training["global_batch_size"]) \
        == (2, 32, 32)
    first, last = par["module_fqns_per_model_part"]
    assert first == ["tok_embeddings"] + [f"layers.{i}" for i in range(16)]
    assert last == [f"layers.{i}" for i in range(16, 32)] + ["norm", "output"]


def test_v_schedule_puts_the_first_and_last_chunk_on_rank_zero():
    doc = _reloaded(_pp_plan("zbv", activation_checkpointing="selective"))
    par = doc["parallelism"]
    assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    # 4 chunks of 8 layers in stage order; torchtitan places stages 0 and 3 on rank 0 (a V).
    assert [len([n for n in part if n.startswith("layers.")]) for part in par["module_fqns_per_model_part"]] \
        == [8, 8, 8, 8]
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    notes = export_text(_pp_plan("zbv", activation_checkpointing="selective"), "torchtitan")[1].notes
    assert not any("Selective activation checkpointing has no config key" in note for note in notes)


def test_expert_parallel_plan_writes_ep():
    plan = make_plan("mistralai/Mixtral-8x7B-v0.1", "8xH100", nodes=2, ep=8, recipe="torchtitan")
    par = _reloaded(plan)["parallelism"]
    # ep 8 is carved out of the 16 FSDP ranks, as torchtitan places it: dp_shard stays 16.
    assert (par["data_parallel_shard_degree"], par["expert_parallel_degree"]) == (16, 8)


@pytest.mark.parametrize("fmt", [row.name for row in FORMAT_TABLE if row.name != "torchtitan"])
def test_other_formats_refuse_pipeline_and_expert_parallelism_with_the_reason(fmt):
    for plan in (_pp_plan(), make_plan("mistralai/Mixtral-8x7B-v0.1", "8xH100", nodes=2, ep=8, recipe="torchtitan")):
        with pytest.raises(ValueError, match=rf"the {fmt} format cannot express mesh .*\(pipeline / expert "
                                             r"parallelism\): .*use --format torchtitan$"):
            export_text(plan, fmt)


def test_cli_pipeline_export_to_accelerate_is_one_line_exit_2(capsys):
    from tests.cli._main import run_main

    code, out, err = run_main(["export", "-m", LLAMA, "-g", "8xH100", "--nodes", "2", "--pp", "2", "-o", "-"], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "ParallelismConfig has dp_replicate, dp_shard, tp and cp" in err
    code, out, err = run_main(["export", "-m", LLAMA, "-g", "8xH100", "--nodes", "2", "--pp", "2", "--format",
                               "torchtitan", "-o", "-"], capsys)
    assert code == 0, err
    assert tomllib.loads(out)["parallelism"]["pipeline_parallel_degree"] == 2


def test_what_torchtitan_cannot_run_is_refused():
    with pytest.raises(ValueError, match="multi-stage schedule"):  # InterleavedZeroBubble needs >= 2 stages per rank
        export_text(_pp_plan("zb_h1"), "torchtitan")
    with pytest.raises(ValueError, match="not --precision fp16-mixed"):
        export_text(make_plan("Qwen/Qwen2.5-0.5B", precision="fp16-mixed", recipe="torchtitan"), "torchtitan")
    with pytest.raises(ValueError, match="Adam and AdamW only"):
        export_text(make_plan("Qwen/Qwen2.5-0.5B", optimizer="sgd", recipe="torchtitan"), "torchtitan")
    with pytest.raises(ValueError, match="runs torch DDP and FSDP2 only"):
        export_text(make_plan(**PLANS["qwen7b_deepspeed_zero2_offload"]), "torchtitan")
    assert json.loads(json.dumps(torchtitan_keys()))["source_commit"].startswith("73a0e6979dd1")


@pytest.mark.parametrize("precision,keys", [
    # torchtitan 0.2.2: FSDP's MixedPrecisionPolicy(param_dtype=training.mixed_precision_param) over fp32
    # parameters (training.dtype float32, the default); pure bf16 stores the parameters in training.dtype.
    ("bf16-mixed", {"mixed_precision_param": "bfloat16"}),
    ("fp32", {"mixed_precision_param": "float32"}),
    ("bf16", {"dtype": "bfloat16"}),
])
def test_precision_keys(precision, keys):
    training = _reloaded(make_plan("Qwen/Qwen2.5-0.5B", precision=precision, recipe="torchtitan"))["training"]
    assert {k: training[k] for k in ("mixed_precision_param", "dtype") if k in training} == keys


def test_a_lora_plan_is_not_written_as_a_torchtitan_job_and_several_nodes_get_a_rendezvous():
    """torchtitan trains every parameter of the model it builds (profiles/recipes.json, torchtitan frozen_base): a
    QLoRA plan was written with PEFT instructions torchtitan cannot follow. Two nodes: the launch line names the node
    rank and the main node's address, as the torchrun export does (it said neither)."""
    qlora = plan("meta-llama/Llama-3.1-8B", "2xA100", lora=16, quantize="nf4", recipe="torchtitan")
    with pytest.raises(ValueError, match="no LoRA, no frozen or quantised base"):
        export_text(qlora, "torchtitan")
    two, _ = export_text(plan("meta-llama/Llama-3.1-8B", "8xH100", nodes=2, recipe="torchtitan"), "torchtitan")
    (launch,) = [line for line in two.splitlines() if line.startswith("# Launch:")]
    assert "--nnodes 2 --node-rank <MACHINE_RANK> --master-addr <MAIN_NODE_IP> --master-port 29500" in launch
    one, _ = export_text(plan("meta-llama/Llama-3.1-8B", "8xH100", recipe="torchtitan"), "torchtitan")
    assert "--node-rank" not in one


@pytest.mark.parametrize("fmt", ["trainer-args", "accelerate"])
def test_a_selective_plan_names_how_to_run_it_where_the_format_has_no_key(fmt):
    """A review: the note said to call wrap() in the script, which under the Trainer prepares the model a second
    time; the file itself checkpoints in full. The note says what the file runs and the call that runs the plan
    before the Trainer or accelerate prepares the model (what wrap() does on accelerate's path)."""
    plan = make_plan("Qwen/Qwen2.5-7B", "8xH100", recipe="trainer", seq_len=16384, activation_checkpointing="selective")
    notes = export_text(plan, fmt)[1].notes
    (note,) = [n for n in notes if n.startswith("Selective activation checkpointing has no config key")]
    assert "checkpoints each block in full" in note
    assert 'wrappers.checkpointing.apply_requested_checkpointing(model, "selective")' in note


def test_a_tp_mesh_gets_no_transformers_loading_note():
    """A review: the TOML of a tp mesh carried 'load the model with tp_plan="auto" ... as wrappers.wrap() runs it',
    which torchtitan never does: its trainer builds the mesh from [parallelism] and applies tp (with sequence
    parallelism and a loss parallel, as the torchtitan recipe plans it), cp and the pipeline itself."""
    text, _ = export_text(_pp_plan(), "torchtitan")
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "tp_plan" not in comments and "wrappers.wrap()" not in comments
    assert "torchtitan's trainer builds this mesh from [parallelism] and applies it itself" in comments
