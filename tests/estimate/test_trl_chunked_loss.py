"""TRL's chunked_nll is not modelled; the note an SFTConfig gets says which way it errs, from a measurement on real
tensors (benchmarks/trl_chunked_loss_bytes.py): every chunk casts the whole head weight, and where the head trains its
backward holds a head-sized gradient, so its loss backward holds more than the full logits the plan counts where a
micro-batch has fewer tokens than about the model's width, far less above. Checked in the setups the note covers: a
full fine-tune under bf16 autocast over fp32 weights (the plan's bf16-mixed) and a frozen bf16 head (LoRA)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import trl_chunked_loss_bytes as bench  # noqa: E402

VOCAB, WIDTH = 32768, 1024


@pytest.mark.parametrize(("setup", "trains"), [("full", True), ("lora", False)])
def test_more_than_the_full_logits_below_the_width_and_far_less_above(setup, trains):
    # two chunks at least: the head's gradient of the second is summed with the first's
    short = dict(tokens=WIDTH // 2, vocab=VOCAB, width=WIDTH, head_trains=trains, setup=setup)
    long = dict(short, tokens=2 * WIDTH)
    trl_short, full_short = bench.measure(bench.chunked_nll, **short), bench.measure(bench.full_logits, **short)
    trl_long, full_long = bench.measure(bench.chunked_nll, **long), bench.measure(bench.full_logits, **long)
    head_bf16 = VOCAB * WIDTH * 2  # every setup casts the whole head at least to bf16 for each chunk
    assert trl_short[1] > full_short[1] and trl_short[1] >= head_bf16
    assert 2 * trl_long[1] < full_long[1]
