"""Cases the randomized sweep (``benchmarks/sweep.py``, seeds 14, 15, 17 and 20) found outside its goal, planned again
as ``advisor plan`` plans them and held to the peak the simulator measured for each (``sweep.jsonl``'s
``sim_bytes``; advisor.simulate, fake tensors, torch 2.13, transformers 5.23). Each names its mechanism and the
error before it was modelled. The cases are drawn again from their seed (``sweep_cases.draw_case``)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sweep import estimate  # noqa: E402
from sweep_cases import case_id, draw_case  # noqa: E402

pytest.importorskip("torch")


@pytest.mark.parametrize("seed, index, case, simulated", [
    # GPT-2 (8,192 learned positions), zero3 x4: the root's other gradients (wpe, ln_f) held at the embedding's
    # backward (strategy_buffers._root_backward_end); -5.78% without them.
    (14, 40, "fe471bf63189", 77_791_192),
    # An untied root's reduce-scatter on two ranks, one: its input, the rank's output and the embedding's gradient
    # (referenced from C++ only) (strategy_buffers._root_backward_end); -7.25%, -7.65%, -4.07% without the last two.
    (17, 17, "34a341f64faf", 745_474_344),
    (20, 73, "a13052844b95", 197_155_016),
    (20, 56, "e33b20dd8847", 834_396_472),
    # A LoRA Qwen2 under the fused loss at s 8192: the final RMSNorm's fp32 backward beside every saved tensor
    # (activations.estimate_activations); -3.77% without it.
    (15, 24, "caf386ea0056", 533_309_112),
    # GPT-2's gelu_new under fp16 autocast: its backward's gradients are fp32; -5.16% counted in fp16.
    (15, 49, "822b1090a834", 276_035_592),
    # The same checkpointed (bf16-mixed, mb 8): two fp32 and one bf16; -13.18% in bf16, +5.13% as three fp32.
    (20, 5, "e833a91921f9", 549_819_400),
    # Phi fp32 GQA on a tp-4 mesh at s 8192: the math kernel's scores, a rank's heads only
    # (model_parallel.split_traced); +13.68% counted whole.
    (15, 50, "35196b8f1f31", 4_164_140_580),
])
def test_the_sweep_case_is_within_one_percent(seed, index, case, simulated):
    warnings.filterwarnings("ignore")
    drawn = draw_case(seed, index)
    assert case_id(drawn) == case
    _, candidate = estimate(drawn)
    assert abs(candidate.memory_bytes.peak_allocated - simulated) <= 0.01 * simulated
