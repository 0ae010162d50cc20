"""Step time on a device mesh (``advisor.estimate.mesh_time``): tensor-parallel traffic worked by hand."""

from __future__ import annotations

import pytest

from advisor.estimate.mesh_time import estimate_mesh_step_time, tp_matmul_width
from advisor.hardware.cluster import parse_gpus
from advisor.hardware.efficiency import load_efficiency
from advisor.mesh import ParallelDims
from advisor.model.sources import resolve_model
from advisor.strategies import STRATEGIES
from advisor.training import TrainingConfig


@pytest.mark.parametrize("checkpointing, passes", [(False, 2), (True, 3)])
def test_tensor_parallel_traffic_by_hand(checkpointing, passes):
    """Llama-3.1-8B (hidden 4,096, 32 blocks), tp 2 on 2 x H100, seq 8,192, micro-batch 1, bf16.

    Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): per block, forward runs 2 all-gathers
    and 2 reduce-scatters of the b x s x h activation, 1 x 8,192 x 4,096 x 2 = 67,108,864 bytes; backward
    the same, and the recomputed forward again under checkpointing. A ring collective of t ranks moves
    (t - 1)/t of the tensor per rank: 1/2 at tp 2. Per block and pass 4 x 67,108,864 / 2 = 134,217,728
    bytes; 32 blocks x 2 passes = 8,589,934,592 bytes over NVLink 4 (450 GB/s a direction) at the
    profile's 80%: 23.86 ms, plus (t - 1) = 1 latency of 2 us per collective, 2 x 32 x 4 x 2 us =
    0.512 ms: 24.37 ms (with checkpointing, 3 passes: 36.56 ms). Before the fix: 12.44 ms (half the
    bytes). With dp = cp = 1 there is no FSDP or ring traffic, so this is all the communication."""
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    hw = parse_gpus("2xH100")
    link, eff = hw.intra_node_link, load_efficiency().communication
    assert (link.bandwidth_gbps, link.latency_us, eff.intra_node_efficiency) == (450.0, 2.0, 0.8)
    expected_s = passes * 32 * (134_217_728 / (450e9 * 0.8) + 4 * 2e-6)
    assert round(expected_s * 1e3, 2) == (24.37 if passes == 2 else 36.56)
    step = estimate_mesh_step_time(spec, hw, TrainingConfig(seq_len=8192), STRATEGIES["zero3"].on("torch"),
                                   ParallelDims(tp=2, world_size=2), micro_batch_size=1,
                                   checkpointing=checkpointing)
    assert step.communication_s == pytest.approx(expected_s, rel=1e-9)


def test_tp_rank_matmuls_are_sized_by_their_elements():
    """A TP rank holds width x width/tp of each weight matrix: as many elements as a dense model of width
    width/sqrt(tp). 8192 at tp 8: 8192 / 2.828427 = 2896.3 -> 2896 (not 8192 / 8 = 1024); 16384 at tp 8 -> 5793;
    5120 at tp 2 -> 3620; tp 1 keeps the width. The size factor then reads 2896 / (2896 + 388) = 0.881851."""
    assert [tp_matmul_width(h, tp) for h, tp in ((8192, 8), (16384, 8), (5120, 2), (4096, 1))] == [2896, 5793, 3620, 4096]
    compute = load_efficiency().compute
    assert compute.shape_factor(hidden_size=2896, tokens_per_micro_batch=10**9) == pytest.approx(0.881851, rel=1e-5)
