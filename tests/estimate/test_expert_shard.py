"""FSDP2's padding of stacked MoE experts (``strategy_buffers.expert_shard_padding``), worked by hand.

Mixtral-8x7B: 8 experts of 3 x 4096 x 14336 = 176,160,768 parameters each: gate_up_proj (8, 28672, 4096),
down_proj (8, 4096, 14336). The simulator check is benchmarks/sweep_case.py 656172c5f2ab (both recipes)."""

from __future__ import annotations

import pytest

from advisor.estimate.strategy_buffers import expert_shard_padding
from advisor.model.sources import resolve

EXPERT = 3 * 4096 * 14336


@pytest.fixture(scope="module")
def mixtral():
    return resolve("mistralai/Mixtral-8x7B-v0.1")[0]


@pytest.mark.parametrize("world, dim1, padded_experts", [
    (8, False, 0), (8, True, 0),  # 8 experts on 8 ranks: one each, nothing padded either way
    (16, False, 8), (64, False, 56),  # dim 0: 16 (64) rows of one expert, 8 of them real
    (16, True, 0), (64, True, 0),  # dim 1: 28672 and 4096 split evenly, so nothing pads
    (12, True, 4),  # 12 divides neither 28672 nor 4096: FSDP2 refuses an uneven dim 1, both stay on dim 0
    (6, True, 4),  # fewer ranks than experts: torchtitan keeps dim 0 (ceil(8/6) = 2 rows a rank, 12 rows)
])
def test_mixtral_padding(mixtral, world, dim1, padded_experts):
    assert mixtral.expert_params == EXPERT and mixtral.num_experts == 8 and mixtral.hidden_size == 4096
    assert expert_shard_padding(mixtral, world, dim1=dim1) == padded_experts * EXPERT


def test_one_tensor_moves_and_the_other_pads(mixtral):
    # 2 experts, h 32, i 24 over 12 ranks: gate_up_proj's 48 rows split evenly on dim 1, down_proj's 32 do not,
    # so down_proj (2 x 32 x 24) stays on dim 0, padded to 12 rows: 10 x 768 elements.
    tiny = mixtral.model_copy(update=dict(num_experts=2, num_experts_per_token=2, hidden_size=32,
                                          expert_params=3 * 32 * 24))
    assert expert_shard_padding(tiny, 12, dim1=True) == 10 * 32 * 24
    assert expert_shard_padding(tiny, 12, dim1=False) == 10 * 3 * 32 * 24
