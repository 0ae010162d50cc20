"""TRL's chunked_nll is not modelled; the note an SFTConfig gets says which way it errs, from a measurement on real
tensors (benchmarks/trl_chunked_loss_bytes.py): the per-chunk fp32 copy of the head weight makes it hold more than the
full logits the plan counts where a micro-batch has fewer tokens than about the model's width, far less above."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import trl_chunked_loss_bytes as bench  # noqa: E402

VOCAB, WIDTH = 4096, 512


@pytest.mark.parametrize("trains", [True, False])
def test_more_than_the_full_logits_below_the_width_and_far_less_above(trains):
    short = dict(tokens=WIDTH // 4, vocab=VOCAB, width=WIDTH, head_trains=trains)
    long = dict(tokens=4 * WIDTH, vocab=VOCAB, width=WIDTH, head_trains=trains)
    head_fp32 = VOCAB * WIDTH * 4
    trl_short, full_short = bench.measure(bench.chunked_nll, **short), bench.measure(bench.full_logits, **short)
    trl_long, full_long = bench.measure(bench.chunked_nll, **long), bench.measure(bench.full_logits, **long)
    assert trl_short[1] > full_short[1] and trl_short[1] >= head_fp32  # the head's fp32 copy at the loss backward
    assert 3 * trl_long[1] < full_long[1]
    assert trl_short[0] >= head_fp32 > full_short[0]  # the forward makes the copy too
