"""Per-GPU peak memory with activation offloading (``--activation-offload``): the analytic estimate against one
training step PyTorch really executes (``advisor.simulate.step``) with the offloading hooks of
``wrappers.activation_offload`` (``host=False``: each offloaded tensor is dropped in forward and made again in
backward, which is what the GPU holds), on the models of ``benchmarks/accuracy.py``, under full and selective
checkpointing (offloading is planned under checkpointing only). Each case runs with and without the hooks, so the
saving is compared too.

Run: python benchmarks/accuracy_offload.py [--no-write]
Prints one row per case and the median and maximum absolute error; writes
benchmarks/results/accuracy_offload.csv and .md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy  # noqa: E402  (the models and their specs)

QV, ALL = None, "all-linear"
# (model, strategy, world, micro-batch, seq, checkpointing ("on" or "selective"), precision, LoRA (rank, targets,
# dropout) or None). Offloading is planned under checkpointing only (advisor.estimate.activation_offload).
CASES = [
    ("qwen0.5b", "ddp", 2, 2, 2048, "on", "bf16-mixed", None),
    ("llama1b", "zero3", 8, 2, 4096, "on", "bf16-mixed", None),
    ("llama1b", "ddp", 1, 2, 2048, "on", "bf16", None),
    ("mha350m", "zero2", 4, 4, 1024, "on", "bf16-mixed", None),
    ("llama1b", "zero3", 8, 2, 4096, "selective", "bf16", None),
    ("qwen0.5b", "zero3", 4, 2, 2048, "on", "bf16-mixed", (16, QV, 0.0)),
    ("llama1b", "ddp", 1, 2, 2048, "selective", "bf16", (16, ALL, 0.0)),
]


def training(seq: int, mode: str, precision: str, lora: tuple | None, offload: bool):
    from advisor.model.lora import LoraConfig
    from advisor.training import TrainingConfig

    adapters = None if lora is None else LoraConfig(rank=lora[0], targets=lora[1], dropout=lora[2])
    return TrainingConfig(seq_len=seq, precision=precision, lora=adapters, activation_offload=offload,
                          activation_checkpointing=mode)


def estimate(key: str, strategy: str, world: int, mb: int, config) -> int:
    """The analytic peak allocated bytes for one case."""
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.lora import with_lora
    from advisor.strategies import get_strategy

    spec = accuracy.spec_for(accuracy.MODELS[key])
    spec = with_lora(spec, config.lora) if config.lora else spec
    return estimate_memory(spec, parse_gpus(f"{world}xH100"), config, get_strategy(strategy).on("torch"),
                           micro_batch_size=mb, checkpointing=True).peak_allocated


def main() -> None:
    write_files = accuracy.simulator_cli(__doc__)
    from advisor.simulate.step import simulate

    start, rows = time.perf_counter(), []
    for key, strategy, world, mb, seq, mode, precision, lora in CASES:
        measured = {}
        for offload in (False, True):
            config = training(seq, mode, precision, lora, offload)
            sim = simulate(accuracy.MODELS[key], world_size=world, strategy=strategy, training=config,
                           micro_batch_size=mb, checkpointing=True)
            measured[offload] = (sim.peak_allocated, estimate(key, strategy, world, mb, config))
        (sim_on, est_on), (sim_off, est_off) = measured[False], measured[True]
        err = round(100 * (est_off - sim_off) / sim_off, 2)
        err_on = round(100 * (est_on - sim_on) / sim_on, 2)
        lora_text = "-" if lora is None else f"r{lora[0]} {lora[1] or 'q,v'}"
        rows.append(dict(model=key, strategy=strategy, world=world, micro_batch=mb, seq_len=seq,
                         checkpointing=mode, precision=precision, lora=lora_text,
                         simulated_bytes=sim_off, analytic_bytes=est_off, analytic_err_pct=err,
                         on_gpu_err_pct=err_on, simulated_saving_bytes=sim_on - sim_off,
                         analytic_saving_bytes=est_on - est_off))
        print(f"{key:9} {strategy:6} {world:2} {mb:2} {seq:5} {mode:9} {precision:10} {lora_text:15} "
              f"sim {sim_off / 2**30:7.3f} est {est_off / 2**30:7.3f} {err:+6.2f}% (on the GPU {err_on:+6.2f}%); "
              f"saving sim {(sim_on - sim_off) / 2**30:6.3f} est {(est_on - est_off) / 2**30:6.3f} GiB", flush=True)
    summary = write(rows, write_files=write_files)
    print(f"{summary} in {time.perf_counter() - start:.0f} s")


def write(rows: list[dict], *, write_files: bool = True) -> str:
    """The summary line; and, with ``write_files``, benchmarks/results/accuracy_offload.csv and .md."""
    summary = accuracy.error_summary(rows)
    if not write_files:
        return summary
    lines = ["# Activation offloading: the estimate against PyTorch's execution", "",
             "Simulated: one measured step (AdamW foreach, SDPA, fake tensors under a fake process group) with the "
             "offloading hooks of wrappers.activation_offload (host=False: each offloaded tensor dropped in forward, "
             "made again in backward), and the same step without them. Written by "
             "`python benchmarks/accuracy_offload.py`. GiB.", "",
             f"Analytic vs simulated, offloading: {summary}. Offloading is planned under activation checkpointing "
             "only (full or selective), as torchtune requires.", "",
             "| model | strategy | GPUs | mb | seq | ckpt | precision | LoRA | simulated | analytic | err | err on the GPU | "
             "saving simulated | saving analytic |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['strategy']} | {r['world']} | {r['micro_batch']} | {r['seq_len']} | "
              f"{r['checkpointing']} | {r['precision']} | {r['lora']} | {r['simulated_bytes'] / 2**30:.3f} | "
              f"{r['analytic_bytes'] / 2**30:.3f} | {r['analytic_err_pct']:+.2f}% | {r['on_gpu_err_pct']:+.2f}% | "
              f"{r['simulated_saving_bytes'] / 2**30:.3f} | {r['analytic_saving_bytes'] / 2**30:.3f} |" for r in rows]
    accuracy.write_results("accuracy_offload", rows, lines)
    return summary


if __name__ == "__main__":
    main()
