"""Wall time of ``advisor.simulate.step`` on a 7B model: Qwen2.5-7B (28 layers), ZeRO-3 on 8 GPUs,
sequence 2048, micro-batch 1, fake tensors on the CPU.

Run: python benchmarks/simulate_speed.py [--model Qwen/Qwen2.5-7B] [--repeat 1]
Prints the wall time of each run (building the model, wrapping, the warm-up and the measured step)
and the simulated peak. Goal (issue 4): under 30 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time
import warnings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-7B")
    parser.add_argument("--strategy", default="zero3")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from advisor.simulate.step import simulate
    from advisor.training import TrainingConfig

    for _ in range(args.repeat):
        start = time.perf_counter()
        stages: list[tuple[str, float]] = []
        result = simulate(args.model, world_size=args.gpus, strategy=args.strategy,
                          training=TrainingConfig(seq_len=args.seq_len), micro_batch_size=args.micro_batch,
                          checkpointing=False, progress=lambda s: stages.append((s, time.perf_counter())))
        wall = time.perf_counter() - start
        marks = [t for _, t in stages] + [start + wall]
        split = ", ".join(f"{name} {b - a:.1f} s" for (name, a), b in zip(stages, marks[1:]))
        print(f"{args.model} {args.strategy} world {args.gpus} seq {args.seq_len} mb {args.micro_batch}: "
              f"{wall:.1f} s ({split}); peak {result.peak_allocated / 2**30:.2f} GiB ({result.peak_phase})")


if __name__ == "__main__":
    main()
