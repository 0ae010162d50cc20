"""How gradients accumulate under FSDP (``--accumulation-sync``): the Trainer's default keeps every unit's
unsharded bf16 gradient until the last micro-batch (accelerate's no_sync); ``every_micro_batch`` (the Trainer's
``accelerator_config`` ``gradient_accumulation_kwargs.sync_each_batch``) reduce-scatters each one. The plan,
the remedy that names it, the export and ``--from`` agree. CPU only, no network."""

from __future__ import annotations

import json

from advisor.estimate.step_time import estimate_step_time
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import resolve_model
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.cli._main import run_main

# Qwen2.5-7B (7,615,616,512 parameters) on 8 x A100 40GB at 8,192 tokens, 16 micro-batches a step.
JOB = ["-m", "Qwen/Qwen2.5-7B", "-g", "8xA100-40GB", "--seq-len", "8192", "--global-batch", "128",
       "--recipe", "trainer"]


def _plan(capsys, *args: str) -> dict:
    code, out, err = run_main(["plan", *args, "--json"], capsys)
    assert code in (0, 3), err
    return json.loads(out)


def _zero3(doc: dict) -> dict:
    return next(c for c in doc["candidates"] if c["strategy"] == "zero3" and c["mesh"] is None)


def test_the_trainers_unsharded_gradients_offload_the_plan_and_the_remedy_names_sync_each_batch(capsys):
    """Under no_sync zero3 holds 2 x 7,615,616,512 bytes of bf16 gradients; reduce-scattered every micro-batch,
    the fp32 shards 4 x 7,615,616,512 / 8: 11,423,424,768 bytes (10.64 GiB) less, 11.75 GiB with the allocator's
    10.4% gap. zero3 then fits on the GPUs alone, so the remedy names the change (context parallelism, which splits
    the activations instead, ranks before it as the faster of the two; both fit only past the headroom). Unpinned, the
    plan is that GPU-only mesh rather than the offload (never offload while a GPU-only plan fits); --tp 1 --cp 1 --pp 1
    keep the data-parallel family, whose answer offloads and lists the remedies, each planned under the degrees the
    user fixed: --cp 4 keeps --tp 1 (dp_shard 2 x cp 4, not cp 4 x tp 2), and more GPUs offer no mesh."""
    unpinned = _plan(capsys, *JOB)
    assert unpinned["recommendation"]["mesh"]["cp"] > 1 and unpinned["recommendation"]["strategy"] == "zero3"
    default = _plan(capsys, *JOB, "--tp", "1", "--cp", "1", "--pp", "1")
    assert default["recommendation"]["strategy"] == "zero3_offload"
    assert not _zero3(default)["fits"]
    names = [x["name"] for x in default["recommendation"]["remedies"]]
    # its zero3 fits at 36.94 of 39.4 GiB, past the 10% headroom, as --cp 4's mesh does (faster): second
    assert names[0] == "--cp 4" and names[1] == "--accumulation-sync every_micro_batch"
    assert not any(name.startswith("--gpus ") for name in names)
    cp4 = default["recommendation"]["remedies"][0]
    mesh = _plan(capsys, *JOB, "--tp", "1", "--cp", "4", "--pp", "1")["recommendation"]["mesh"]
    assert cp4["mesh"] == "dp_shard 2 x cp 4" and (mesh["dp_shard"], mesh["cp"], mesh["tp"]) == (2, 4, 1)
    remedy = default["recommendation"]["remedies"][1]
    assert (remedy["name"], remedy["keeps_math"], remedy["strategy"], remedy["fits"], remedy["past_headroom"]) == (
        "--accumulation-sync every_micro_batch", True, "zero3", True, True)
    assert remedy["saved_gib"] == 11.75
    synced = _plan(capsys, *JOB, "--tp", "1", "--cp", "1", "--pp", "1", "--accumulation-sync", "every_micro_batch")
    assert synced["recommendation"]["strategy"] == "zero3"
    held = _zero3(default)["memory_bytes"]["grads"] - _zero3(synced)["memory_bytes"]["grads"]
    assert held == 2 * 7_615_616_512 - 4 * 7_615_616_512 // 8
    assert any("accelerate's no_sync" in line for line in default["assumptions"])


def test_the_export_writes_sync_each_batch_and_reads_it_back(tmp_path, capsys):
    from transformers import TrainingArguments

    args = [*JOB, "--accumulation-sync", "every_micro_batch", "--strategy", "zero3"]
    path = tmp_path / "args.json"
    code, _, err = run_main(["export", *args, "--format", "trainer-args", "-o", str(path)], capsys)
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["accelerator_config"] == {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    doc["bf16"] = False  # this test machine has no bf16-capable GPU
    parsed = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, **doc)
    assert parsed.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}
    # TrainingArguments has no sequence length: the model, the GPUs and --seq-len are typed
    written, read_back = _plan(capsys, *args), _plan(capsys, *JOB[:6], "--from", str(path))
    assert read_back["training"]["accumulation_sync"] == "every_micro_batch"
    assert _zero3(read_back)["memory_bytes"] == _zero3(written)["memory_bytes"]


def test_the_trainers_default_writes_no_accelerator_config(tmp_path, capsys):
    path = tmp_path / "args.json"
    code, _, err = run_main(["export", *JOB, "--strategy", "zero3", "--format", "trainer-args", "-o", str(path)], capsys)
    assert code == 0, err
    assert "accelerator_config" not in json.loads(path.read_text())


def test_a_plan_without_accumulation_says_nothing_of_it(capsys):
    doc = _plan(capsys, "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "--recipe", "trainer")
    assert not any("gradient accumulation" in line for line in doc["assumptions"])
    assert "accumulation_sync" not in doc["training"]


def test_no_sync_reduce_scatters_once_a_step():
    """FSDP's reduce-scatter runs every micro-batch under the torch recipe and once a step under the Trainer's
    no_sync; the all-gathers run every micro-batch under both. So the two recipes' transfer seconds differ by
    (k - 1) reduce-scatters over k micro-batches, the reduce-scatter read off their one- and two-micro-batch
    steps (same fused optimizer, so only the sync differs)."""
    spec, hw, impl = resolve_model("Qwen/Qwen2.5-7B"), parse_gpus("8xA100"), get_strategy("zero3").on("torch")

    def comm(sync: str, steps: int) -> float:
        training = TrainingConfig(recipe="trainer", accumulation_sync=sync, global_batch_size=8 * steps)
        return estimate_step_time(spec, hw, training, impl, micro_batch_size=1, checkpointing=True,
                                  gradient_accumulation_steps=steps).communication_s

    every = {k: comm("every_micro_batch", k) for k in (1, 2, 4)}
    last = {k: comm("last_micro_batch", k) for k in (1, 2, 4)}
    assert abs(every[1] - last[1]) < 1e-12
    reduce_scatter = (every[2] - every[1]) - (last[2] - last[1])
    assert reduce_scatter > 0
    assert abs((every[4] - last[4]) - 3 * reduce_scatter) < 1e-9


def test_the_trainers_reduce_scatter_moves_half_the_bytes():
    """accelerate's policy reduce-scatters bf16 gradients, wrap()'s fp32. Each recipe's reduce-scatter seconds are
    read off its one- and two-micro-batch steps with the sync every micro-batch against once a step (as in the test
    above); the Trainer's are about half the torch recipe's (the links' latency terms are the same)."""
    spec, hw, impl = resolve_model("Qwen/Qwen2.5-7B"), parse_gpus("8xA100"), get_strategy("zero3").on("torch")

    def comm(recipe: str, sync: str, steps: int) -> float:
        training = TrainingConfig(recipe=recipe, accumulation_sync=sync, optimizer_impl="fused",
                                  global_batch_size=8 * steps)
        return estimate_step_time(spec, hw, training, impl, micro_batch_size=1, checkpointing=True,
                                  gradient_accumulation_steps=steps).communication_s

    def reduce_scatter(recipe: str) -> float:
        every = comm(recipe, "every_micro_batch", 2) - comm(recipe, "every_micro_batch", 1)
        return every - (comm(recipe, "last_micro_batch", 2) - comm(recipe, "last_micro_batch", 1))

    assert 0.45 < reduce_scatter("trainer") / reduce_scatter("torch") < 0.55


def test_the_accelerate_export_says_where_sync_each_batch_goes(tmp_path, capsys):
    """accelerate's config file has no key for it: the note names GradientAccumulationPlugin(sync_each_batch=True),
    a real argument of the installed accelerate."""
    import inspect

    from accelerate.utils import GradientAccumulationPlugin

    assert "sync_each_batch" in inspect.signature(GradientAccumulationPlugin).parameters
    args = [*JOB, "--accumulation-sync", "every_micro_batch", "--strategy", "zero3"]
    code, _, err = run_main(["export", *args, "--format", "accelerate", "-o", str(tmp_path / "a.yaml")], capsys)
    assert code == 0 and "GradientAccumulationPlugin(num_steps=..., sync_each_batch=True)" in err
    code, _, err = run_main(["export", *JOB, "--strategy", "zero3", "--format", "accelerate", "-o",
                             str(tmp_path / "b.yaml")], capsys)
    assert code == 0 and "sync_each_batch" not in err
