"""FSDP1 (accelerate's ``fsdp_version: 1``): the estimate (``TrainingConfig(fsdp_version=1)``,
``advisor.estimate.fsdp1_buffers``) against one FSDP1 step on real CPU tensors and a fake process group
(``advisor.simulate.fsdp1_step``), per phase and at the peak.

Run: python benchmarks/accuracy_fsdp1.py [--no-write]
Writes benchmarks/results/accuracy_fsdp1.csv and .md. Small models only (real tensors: see the simulator's
docstring), 2 ranks, micro-batch 1, bf16-mixed, AdamW as each recipe steps it, full checkpointing.
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))

TINY_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=176,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=8192,
                  max_position_embeddings=1024, tie_word_embeddings=False, _name_or_path="tiny-llama-8k")
QWEN2_256 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=256, intermediate_size=1024,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                 max_position_embeddings=4096, tie_word_embeddings=True, _name_or_path="tiny-qwen2-4k")
# (model, strategy, LoRA rank or None, seq_len, recipe): the torch recipe wraps each decoder layer with its
# adapters; the Trainer's (Recipe.adapter_units) gives every adapter a unit of its own (PEFT's wrap policy)
CASES = [(TINY_LLAMA, "zero3", None, 64, "torch"), (TINY_LLAMA, "zero2", None, 64, "torch"),
         (QWEN2_256, "zero3", None, 256, "torch"), (QWEN2_256, "zero2", None, 256, "torch"),
         (QWEN2_256, "zero3", 8, 256, "torch"), (QWEN2_256, "zero2", 8, 256, "torch"),
         (QWEN2_256, "zero3", 8, 256, "trainer"), (QWEN2_256, "zero2", 8, 256, "trainer")]
MOMENTS = ("start_of_forward", "end_of_forward", "loss_backward", "block_backward", "end_of_backward", "optimizer_step")


def run_case(cfg: dict, strategy: str, rank: int | None, seq_len: int, recipe: str = "torch") -> dict:
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.lora import LoraConfig, with_lora
    from advisor.model.sources import spec_from_config
    from advisor.simulate.fsdp1_step import simulate_fsdp1
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    lora = LoraConfig(rank=rank) if rank else None
    training = TrainingConfig(seq_len=seq_len, fsdp_version=1, lora=lora, recipe=recipe)
    spec = spec_from_config(cfg, name=cfg["_name_or_path"], source="local")
    spec = with_lora(spec, lora) if lora else spec
    est = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy(strategy).on("torch"),
                          micro_batch_size=1, checkpointing=True)
    sim = simulate_fsdp1(cfg, world_size=2, strategy=strategy, training=training, micro_batch_size=1,
                         checkpointing=True)
    row = {"model": cfg["_name_or_path"], "strategy": strategy, "lora": rank or "", "recipe": recipe, "seq_len": seq_len,
           "simulated": sim["peak_allocated"], "estimated": est.peak_allocated, "peak_moment": est.peak_moment}
    row["error_pct"] = round(100 * (row["estimated"] / row["simulated"] - 1), 2)
    for moment in MOMENTS:  # a window the simulator merged into the next one (a frozen embedding) is blank
        row[f"sim_{moment}"] = sim["moments"].get(moment, "")
        row[f"est_{moment}"] = est.moments.get(moment, "")
    return row


def _n(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for case in CASES:
        rows.append(run_case(*case))
        print(rows[-1], flush=True)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        with open(RESULTS / "accuracy_fsdp1.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        lines = ["# FSDP1 estimate vs FSDP1 simulated step", "",
                 "`python benchmarks/accuracy_fsdp1.py`: 2 ranks, micro-batch 1, bf16-mixed (accelerate's FSDP1 "
                 "MixedPrecision: bf16 param/reduce/buffer), AdamW as each recipe steps it (torch foreach, trainer "
                 "fused), full checkpointing, BACKWARD_PRE, "
                 "limit_all_gathers, use_orig_params. Bytes per rank; per phase the largest moment. The trainer rows: "
                 "HF Trainer's PEFT wrap policy (every lora_A / lora_B its own unit, the layers' units only the frozen "
                 "base, loaded in bf16) and accelerate's autocast around the forward; the torch rows: each layer's "
                 "unit with its adapters (a gradient for the whole unit, the base upcast to fp32).", "",
                 "The simulator's window for block_backward also holds the head's matmul backward, which no "
                 "moment of the estimate models (FSDP2's neither); SHARD_GRAD_OP has no start_of_forward moment "
                 "of its own in the estimate.", "",
                 "| model | strategy | LoRA | recipe | seq | simulated | estimated | error % | peak moment | "
                 + " | ".join(f"{m} sim / est" for m in MOMENTS) + " |",
                 "|---|---|---|---|---|---|---|---|---|" + "---|" * len(MOMENTS)]
        for r in rows:
            lines.append(f"| {r['model']} | {r['strategy']} | {r['lora']} | {r['recipe']} | {r['seq_len']} | "
                         f"{r['simulated']:,} | "
                         f"{r['estimated']:,} | {r['error_pct']} | {r['peak_moment']} | "
                         + " | ".join(f"{_n(r['sim_' + m])} / {_n(r['est_' + m])}" for m in MOMENTS) + " |")
        (RESULTS / "accuracy_fsdp1.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
