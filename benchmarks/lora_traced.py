"""LoRA on families with no formula (issue 20, item 3): the plan's peak against the simulated PEFT step at
the real width of tests/data/configs (4 blocks: the fake-tensor step of all 32 takes minutes on 2 cores).

    python benchmarks/lora_traced.py phi-2 ddp 1 off
    python benchmarks/lora_traced.py phi-2 zero3 2 on all-linear
    python benchmarks/lora_traced.py starcoder2-3b ddp 1 off q_proj,v_proj

Arguments: config dir name, strategy, micro-batch, checkpointing (on/off), targets (default: PEFT's).
Rank 16, seq 512, 2 GPUs. Figures measured: docs/fine-tuning.md.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from advisor.model.lora import LoraConfig
from advisor.planning.api import plan
from advisor.simulate.step import simulate
from advisor.training import TrainingConfig

CONFIGS = Path(__file__).parents[1] / "tests" / "data" / "configs"


def main(name: str, strategy: str, mb: str, ckpt: str, targets: str | None = None) -> None:
    cfg = {**json.loads((CONFIGS / name / "config.json").read_text()), "num_hidden_layers": 4}
    lora = LoraConfig(rank=16, targets=None if targets is None else "all-linear" if targets == "all-linear"
                      else tuple(targets.split(",")))
    started = time.perf_counter()
    sim = simulate(dict(cfg), world_size=2, strategy=strategy, training=TrainingConfig(seq_len=512, lora=lora),
                   micro_batch_size=int(mb), checkpointing=ckpt == "on")
    planned = plan(dict(cfg), gpus="2xA100", strategy=strategy, micro_batch_size=int(mb), seq_len=512, lora=lora,
                   activation_checkpointing=ckpt, cache_dir=None)
    est = planned.candidate(strategy).memory_bytes.peak_allocated
    print(f"{name} (4 blocks, real width) {strategy} mb{mb} checkpointing {ckpt} targets {targets or 'default'}: "
          f"adapters {planned.model.trainable_params:,} (simulated {sim.trainable_params:,}); estimate {est:,} B, "
          f"simulated {sim.peak_allocated:,} B, {100 * (est - sim.peak_allocated) / sim.peak_allocated:+.2f}% "
          f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main(*sys.argv[1:])
