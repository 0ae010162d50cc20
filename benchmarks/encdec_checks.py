"""Encoder-decoder estimates against the simulated step beyond benchmarks/model_kinds.py's rows: a
target length other than the source length, and activation checkpointing (scaled T5-large, eager
attention; scaled BART-large, SDPA; configs from model_kinds.py).

Run: PYTHONPATH=. python benchmarks/encdec_checks.py   (prints one line per case; about 2 minutes)
"""

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from accuracy import spec_for  # noqa: E402
from model_kinds import BART_SCALED, T5_SCALED  # noqa: E402

from advisor.estimate.memory import estimate_memory  # noqa: E402
from advisor.hardware.cluster import parse_gpus  # noqa: E402
from advisor.simulate.step import simulate  # noqa: E402
from advisor.strategies import get_strategy  # noqa: E402
from advisor.training import TrainingConfig  # noqa: E402

CASES = [("T5 eager", T5_SCALED, "eager", 512, 128, False), ("BART sdpa", BART_SCALED, "sdpa", 512, 128, False),
         ("T5 eager", T5_SCALED, "eager", 512, None, True), ("BART sdpa", BART_SCALED, "sdpa", 512, None, True)]


def main() -> None:
    for name, cfg, attention, seq, target, ckpt in CASES:
        training = TrainingConfig(seq_len=seq, target_len=target, attention=attention)
        sim = simulate(cfg, world_size=8, strategy="zero3", training=training, micro_batch_size=8, checkpointing=ckpt)
        est = estimate_memory(spec_for(cfg), parse_gpus("8xH100"), training, get_strategy("zero3").on("torch"),
                              micro_batch_size=8, checkpointing=ckpt)
        error = 100 * (est.peak_allocated - sim.peak_allocated) / sim.peak_allocated
        print(f"{name} zero3 8xH100 mb 8 seq {seq} target {target or seq} ckpt {ckpt}: simulated "
              f"{sim.peak_allocated / 2**30:.3f} GiB, analytic {est.peak_allocated / 2**30:.3f} GiB, {error:+.2f}%",
              flush=True)


if __name__ == "__main__":
    main()
