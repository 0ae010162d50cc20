"""One MoE layer on one expert-parallel rank: the estimate (advisor.estimate.pipeline_experts) against the
layer simulator (advisor.simulate.moe_layer) and against bytes worked by hand.

A tiny Mixtral layer, fp32: h 32, expert width I 16, E 4 experts, top-2 (renormalised), 8 tokens, so
R = k x tokens = 16 routed rows on every rank whatever ep (balanced dropless routing).
benchmarks/accuracy_moe_ep.py runs the same comparison at the published widths (27 cases).
"""

from __future__ import annotations

import pytest

from advisor.estimate.activations import Dtypes
from advisor.estimate.pipeline_experts import moe_rank_bytes
from advisor.model.sources import spec_from_config
from advisor.simulate.moe_layer import simulate_moe_layer

H, I, E, K, T = 32, 16, 4, 2, 8
R = K * T
FP32 = Dtypes(residual=4, compute=4, input_casts=False)
TINY_MIXTRAL = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=H, intermediate_size=I,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                    num_local_experts=E, num_experts_per_tok=K)
SAVED_EP = (
    T * (E * 4 + K * 8 + 4 + K * 4)  # router: fp32 softmax, top-k indices, the weights' sum and the normalised weights
    + R * (4 * (2 * H + 4 * I) + 4)  # per row: received and returned rows (h each), 2I + I + I of the SwiGLU, fp32 weight
    + R * 3 * 8                      # three int64 index vectors (token of each row, expert order, its inverse)
    + R * 2 * 8                      # ep only: the received rows' sort by local expert and its inverse
)


def _spec():
    return spec_from_config(TINY_MIXTRAL, name="tiny-mixtral", source="local")


@pytest.mark.parametrize("ep", [2, 4])
def test_saved_matches_the_simulator_exactly(ep):
    est = moe_rank_bytes(_spec(), FP32, ep=ep, tp=1, tokens=T, param_bytes=4)
    sim = simulate_moe_layer(hidden=H, expert_intermediate=I, num_experts=E, top_k=K, ep=ep, tokens=T,
                             normalized_top_k=True)
    assert SAVED_EP == 9248
    assert sim.held_after_forward == SAVED_EP
    assert est.saved == SAVED_EP  # bound: 0 bytes (benchmarks/accuracy_moe_ep.py: 0.000% at ep 2 and 4)
    assert est.params == sim.params == (E * H + E // ep * 3 * I * H) * 4
    assert est.dispatch == 2 * R * H * 4  # send and receive buffers of one exchange


def test_ep_1_is_transformers_path_without_the_ep_sort():
    """At ep 1 the estimate books transformers' unsharded experts; the simulator still runs the ep path,
    whose sort by local expert saves two int64 vectors more (16 bytes a row)."""
    est = moe_rank_bytes(_spec(), FP32, ep=1, tp=1, tokens=T, param_bytes=4)
    sim = simulate_moe_layer(hidden=H, expert_intermediate=I, num_experts=E, top_k=K, ep=1, tokens=T,
                             normalized_top_k=True)
    assert sim.held_after_forward - est.saved == R * 2 * 8
    assert est.dispatch == 0 and est.imbalance == 0


def test_imbalance_is_the_busiest_ranks_extra_rows():
    """profiles/expert_parallel.json: 1.25 x the mean rows on the busiest rank: 0.25 x 16 = 4 rows more, each
    keeping its two h-wide rows and 4 I of the SwiGLU (fp32)."""
    est = moe_rank_bytes(_spec(), FP32, ep=2, tp=1, tokens=T, param_bytes=4)
    assert est.imbalance == 4 * 4 * (2 * H + 4 * I) == 2048
