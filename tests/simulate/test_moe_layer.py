"""One expert-parallel MoE layer on fake tensors (advisor.simulate.moe_layer) against bytes worked by hand.

h 8, expert width I 16, E 4 experts, top-k 2, 8 tokens, fp32: R = k x tokens = 16 rows after the dispatch.
"""

from __future__ import annotations

import pytest

from advisor.simulate.moe_layer import simulate_moe_layer

H, I, E, K, T = 8, 16, 4, 2, 8
R = K * T
HELD = (
    T * E * 4       # fp32 softmax output (its backward reads it)
    + T * K * 8     # top-k indices (int64)
    + T * K * 4     # top-k values, the router weights (saved by the combine's multiply)
    + R * H * 4     # the receive buffer of the dispatch (the experts' first matmuls save their slices)
    + 4 * R * I * 4  # per row: gate output (SiLU's input), SiLU output, up output, their product
    + R * H * 4     # the receive buffer of the combine's all-to-all (saved by the multiply)
    + R * H * 4     # the weighted rows (index_add's backward formula expands to their shape: it keeps them)
)


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_one_rank_of_an_ep_sharded_layer(ep):
    layer = simulate_moe_layer(hidden=H, expert_intermediate=I, num_experts=E, top_k=K, ep=ep, tokens=T)
    assert layer.num_local_experts == E // ep
    # Router E x h (replicated) and E/ep SwiGLU experts of 3 x I x h, fp32.
    assert layer.params == (E * H + (E // ep) * 3 * I * H) * 4
    # Balanced dropless routing: every ep rank computes k x tokens rows, whatever ep (ep trades rows, it does
    # not remove them), so what the forward holds does not depend on ep.
    assert layer.rows == R
    assert HELD == 5952
    assert layer.held_after_forward == HELD


def test_bad_ep_is_one_line():
    with pytest.raises(ValueError, match="--ep 3 does not divide the 4 experts"):
        simulate_moe_layer(hidden=H, expert_intermediate=I, num_experts=E, top_k=K, ep=3, tokens=T)
