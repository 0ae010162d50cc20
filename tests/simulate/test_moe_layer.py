"""One expert-parallel MoE layer on fake tensors (advisor.simulate.moe_layer) against bytes worked by hand.

h 8, expert width I 16, E 4 experts, top-k 2, 8 tokens, fp32: R = k x tokens = 16 rows after the dispatch.
The path is ``wrappers.experts``' (dispatch, sort by local expert, grouped matmuls, combine as transformers
sums the k choices); the estimate's figure for it is checked in tests/estimate/test_pipeline_experts.py.
"""

from __future__ import annotations

import pytest

from advisor.simulate.moe_layer import simulate_moe_layer

H, I, E, K, T = 8, 16, 4, 2, 8
R = K * T
HELD = (
    T * E * 4       # fp32 softmax output (its backward reads it)
    + T * K * 8     # top-k indices (int64; top-k's backward scatters through them)
    + R * 8         # token of each row (int64), read by the dispatch copy's backward
    + R * 8         # received rows by local expert (int64), read by the sort's backward
    + R * H * 4     # the sorted received rows (the first grouped matmul's input)
    + 4 * R * I * 4  # per row: gate and up outputs (2I, kept whole), SiLU output, their product
    + R * 8         # the inverse sort (int64), putting the expert outputs back in received order
    + R * H * 4     # the receive buffer of the combine's all-to-all (saved by the weights' multiply)
    + R * 4         # the router weights in expert order (fp32, saved by the multiply)
    + R * 8         # the expert order (int64), read by the weights' gather
    + R * 8         # the inverse of the expert order (int64), putting the rows back in (token, choice) order
)  # the weighted rows are not kept: the index and the sum over k save none of them


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_one_rank_of_an_ep_sharded_layer(ep):
    layer = simulate_moe_layer(hidden=H, expert_intermediate=I, num_experts=E, top_k=K, ep=ep, tokens=T)
    assert layer.num_local_experts == E // ep
    # Router E x h (replicated) and E/ep SwiGLU experts of 3 x I x h (gate_up 2I x h, down h x I), fp32.
    assert layer.params == (E * H + (E // ep) * 3 * I * H) * 4
    # Balanced dropless routing: every ep rank computes k x tokens rows, whatever ep (ep trades rows, it does
    # not remove them), so what the forward holds does not depend on ep.
    assert layer.rows == R
    assert HELD == 6080
    assert layer.held_after_forward == HELD


def test_bad_ep_is_one_line():
    with pytest.raises(ValueError, match="--ep 3 does not divide the 4 experts"):
        simulate_moe_layer(hidden=H, expert_intermediate=I, num_experts=E, top_k=K, ep=3, tokens=T)
