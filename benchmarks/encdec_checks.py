"""Encoder-decoder estimates against the simulated step beyond benchmarks/model_kinds.py's rows: a
target length other than the source length, and activation checkpointing (scaled T5-large, eager
attention; scaled BART-large, SDPA; configs from model_kinds.py); LoRA on the frozen base (PEFT's default
targets and all-linear, checkpointing off and on, T5's gated feed-forward as T5 v1.1 / flan-t5 have it) under
DDP; DoRA, which the planner refuses on these families, is listed with its refusal.

Run: PYTHONPATH=. python benchmarks/encdec_checks.py        (one line per case; about 10 minutes)
     PYTHONPATH=. python benchmarks/encdec_checks.py lora   (the LoRA rows only; about 7 minutes)
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
T5_GATED_SCALED = {**T5_SCALED, "feed_forward_proj": "gated-gelu", "_name_or_path": "scaled/t5-gated"}
# LoRA r16 on the frozen bf16 base (fp32 adapters under autocast), DDP on 2 H100s, micro-batch 4, source 256,
# target 128: (name, config, targets, checkpointing, dora)
LORA_CASES = [("T5 eager", T5_SCALED, ("q", "v"), False, False), ("T5 eager", T5_SCALED, ("q", "v"), True, False),
              ("T5 eager", T5_SCALED, "all-linear", False, False), ("T5 eager", T5_SCALED, "all-linear", True, False),
              ("BART sdpa", BART_SCALED, ("q_proj", "v_proj"), True, False),
              ("BART sdpa", BART_SCALED, "all-linear", False, False),
              ("BART sdpa", BART_SCALED, "all-linear", True, False),
              ("gated T5 eager", T5_GATED_SCALED, ("q", "v"), False, False),
              ("gated T5 eager", T5_GATED_SCALED, "all-linear", True, False),
              ("T5 eager", T5_SCALED, ("q", "v"), False, True)]


def lora_main() -> None:
    from advisor.model.lora import LoraConfig, with_lora
    from advisor.model.sources import spec_from_config

    for name, cfg, targets, ckpt, dora in LORA_CASES:
        lora = LoraConfig(rank=16, targets=targets, dora=dora)
        training = TrainingConfig(seq_len=256, target_len=128, lora=lora,
                                  attention="eager" if cfg["model_type"] == "t5" else "sdpa")
        names = targets if isinstance(targets, str) else ",".join(targets)
        label = f"{name} {'DoRA' if dora else 'LoRA'} r16 {names} ddp 2xH100 mb 4 seq 256 target 128 ckpt {ckpt}"
        spec = with_lora(spec_from_config(cfg, name=cfg["_name_or_path"], source="local"), lora)
        try:
            est = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy("ddp").on("torch"),
                                  micro_batch_size=4, checkpointing=ckpt)
        except ValueError as err:  # the planner's refusal (DoRA on T5 / BART)
            print(f"{label}: refused ({err})", flush=True)
            continue
        sim = simulate(cfg, world_size=2, strategy="ddp", training=training, micro_batch_size=4, checkpointing=ckpt)
        error = 100 * (est.peak_allocated - sim.peak_allocated) / sim.peak_allocated
        print(f"{label}: simulated {sim.peak_allocated / 2**20:.1f} MiB, analytic {est.peak_allocated / 2**20:.1f} MiB"
              f" ({est.peak_moment}), {error:+.2f}%", flush=True)


def main() -> None:
    if sys.argv[1:] == ["lora"]:
        lora_main()
        return
    full_main()
    lora_main()


def full_main() -> None:
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
