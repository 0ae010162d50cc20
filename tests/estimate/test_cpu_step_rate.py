"""``--cpu-step-rate``: the offloaded optimizer step at the rate the user measured on their own host (two hosts
measured 2.1-3.6x apart: benchmarks/results/cpu_optimizer*.md). Worked by hand. CPU only, no network."""

from __future__ import annotations

import json

from advisor.estimate.step_time import estimate_step_time
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import resolve_model
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.cli._main import run_main

TRAINABLE = 7_615_616_512  # Qwen2.5-7B


def _offload_s(rate: float | None, strategy: str = "zero2_offload", engine: str = "torch") -> tuple[float, list[str]]:
    training = TrainingConfig(cpu_step_rate=rate, engine=engine)
    step = estimate_step_time(resolve_model("Qwen/Qwen2.5-7B"), parse_gpus("2xA100"), training,
                              get_strategy(strategy).on(engine), micro_batch_size=1, checkpointing=True)
    return step.offload_s, list(step.notes)


def test_the_cpu_step_takes_the_given_rate():
    """Two processes on the node step the 3,807,808,256-parameter shards: at 1e9 a process, 2 x 3,807,808,256 /
    2e9 = 3.81 s; at 2e9, 1.90 s. The transfers are the same, so the offload seconds differ by 1.903904128."""
    slow, notes = _offload_s(1e9)
    fast, _ = _offload_s(2e9)
    assert abs((slow - fast) - 2 * (TRAINABLE // 2) * (1 / 2e9 - 1 / 4e9)) < 1e-9
    assert any("--cpu-step-rate, as given" in n and "1.00G parameters/s a process" in n for n in notes)
    assert _offload_s(None)[0] != slow  # without it: the measured default


def test_deepspeeds_cpu_adam_takes_it_too():
    slow, _ = _offload_s(1e9, engine="deepspeed")
    fast, _ = _offload_s(2e9, engine="deepspeed")
    assert abs((slow - fast) - 2 * (TRAINABLE // 2) * (1 / 2e9 - 1 / 4e9)) < 1e-9


def test_the_cli_option_reaches_the_plan(capsys):
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "--strategy", "zero2_offload",
                               "--cpu-step-rate", "5e8", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["training"]["cpu_step_rate"] == 5e8
    code, _, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xA100", "--cpu-step-rate", "-1"], capsys)
    assert code == 2 and "Traceback" not in err


def test_no_sync_offloads_the_gradients_once_a_step():
    """FSDP offload under the Trainer's no_sync keeps the unsharded gradients on the GPU until the last micro-batch,
    so the shards go down to the CPU once a step, not once a micro-batch: with sync every micro-batch the offload
    transfers of two micro-batches exceed those of one by both directions' seconds, under no_sync by the uploads
    alone, and the difference of those two differences is one gradient download of the shard."""
    spec, hw, impl = resolve_model("Qwen/Qwen2.5-7B"), parse_gpus("2xA100"), get_strategy("zero3_offload").on("torch")

    def offload(sync: str, steps: int) -> float:
        training = TrainingConfig(recipe="trainer", accumulation_sync=sync, global_batch_size=2 * steps)
        return estimate_step_time(spec, hw, training, impl, micro_batch_size=1, checkpointing=True,
                                  gradient_accumulation_steps=steps).offload_s

    every = offload("every_micro_batch", 2) - offload("every_micro_batch", 1)
    last = offload("last_micro_batch", 2) - offload("last_micro_batch", 1)
    assert abs((offload("last_micro_batch", 3) - offload("last_micro_batch", 2)) - last) < 1e-9  # per micro-batch
    # Per micro-batch under no_sync: the fp32 shard uploaded twice (the forward's and the backward's gathers); the
    # download it no longer makes each micro-batch is that shard once, the same bytes over the same link: half.
    assert abs((every - last) / last - 0.5) < 1e-6
