"""The schedule table's counts against the orders torch.distributed.pipelining generates.

Each multi-stage schedule class computes every rank's list of actions (F, I = input gradient, W = weight
gradient, B = full backward) in its constructor, from the group size and the micro-batch count alone
(``_calculate_single_rank_operations``). The constructor wants live stages; the orders do not: the
attributes it reads are set on a bare instance here and the order is generated on CPU, no process group.
On each rank the count is taken when a backward (I or B) starts, as the estimate counts: the chunk
micro-batches whose forward has run and whose backward has not (the running one included), and the
micro-batches whose I has run and whose W has not, at the moment the first count peaks. Chunk counts
are 1/v of a rank micro-batch (``in_flight``'s unit). ``Schedule1F1B`` and ``ScheduleGPipe`` keep no
generated order (``PipelineScheduleSingle``); their counts are worked by hand in test_pipeline.py.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from advisor.estimate.pipeline_schedules import in_flight, w_held

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
C = schedules._ComputationType


def _orders(name: str, *, pp: int, m: int, v: int) -> dict[int, list]:
    cls = getattr(schedules, name)
    sched = cls.__new__(cls)  # the attributes __init__ sets before it generates the orders
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = pp, v, m
    sched.number_of_rounds = max(1, m // pp)
    sched.microbatches_per_round = m // sched.number_of_rounds
    sched.num_stages = sched._num_stages = pp * v
    sched.pipeline_order = {rank: sched._calculate_single_rank_operations(rank) for rank in range(pp)}
    return sched.pipeline_order


def _peak(actions: list) -> tuple[int, int]:
    """(chunk micro-batches in flight, W pending) when a backward starts, at the largest in-flight count."""
    live, pending, peak = set(), set(), (0, 0)
    for action in actions:
        for a in (action.sub_actions or (action,)) if action is not None else ():  # OVERLAP_F_B runs F, then B
            key = (a.stage_index, a.microbatch_index)
            if a.computation_type == C.FORWARD:
                live.add(key)
            elif a.computation_type in (C.FULL_BACKWARD, C.BACKWARD_INPUT):
                peak = max(peak, (len(live), len(pending)))
                live.discard(key)
                if a.computation_type == C.BACKWARD_INPUT:
                    pending.add(key)
            elif a.computation_type == C.BACKWARD_WEIGHT:
                pending.discard(key)
    return peak


CASES = [(pp, m) for pp in (2, 4, 8) for m in (pp, 2 * pp, 4 * pp)]


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("pp, m", CASES)
def test_interleaved_1f1b_in_flight_is_torchs(pp, m, v):
    """Megatron's warm-up 2 (p - i - 1) + (v - 1) p chunk forwards plus the steady one: torch's
    ScheduleInterleaved1F1B holds the same on every rank (pp 4, v 2: 11, 9, 7, 5 chunks; rank 0's
    11/2 = p (1 + (p - 1)/(p v)) rank micro-batches, the interleaving penalty), m v at most."""
    orders = _orders("ScheduleInterleaved1F1B", pp=pp, m=m, v=v)
    got = [Fraction(_peak(orders[rank])[0], v) for rank in range(pp)]
    assert got == [in_flight("interleaved_1f1b", rank=r, pp=pp, micro_batches=m, chunks=v) for r in range(pp)]
    if (pp, m, v) == (4, 8, 2):
        assert got == [Fraction(11, 2), Fraction(9, 2), Fraction(7, 2), Fraction(5, 2)]


@pytest.mark.parametrize("pp, m", CASES)
def test_zb_h1_is_torchs_interleaved_zero_bubble_at_one_stage(pp, m):
    """torch's ScheduleInterleavedZeroBubble (its docstring: the paper's ZB-1p) at one stage per rank:
    p - 1 - i warm-up forwards, then F, I with W lagging i backwards: p - i in flight and i W pending."""
    orders = _orders("ScheduleInterleavedZeroBubble", pp=pp, m=m, v=1)
    got = [_peak(orders[rank]) for rank in range(pp)]
    assert got == [(pp - r, r) for r in range(pp)]
    assert got == [(in_flight("zb_h1", rank=r, pp=pp, micro_batches=m),
                    w_held("zb_h1", rank=r, pp=pp, micro_batches=m)) for r in range(pp)]


@pytest.mark.parametrize("pp, m", [(pp, m) for pp in (2, 3, 4, 8) for m in range(1, 2 * pp + 2)])
def test_zbv_in_flight_is_torchs(pp, m):
    """torch's ScheduleZBVZeroBubble: min(2m, m + i + 1, 2p) chunk micro-batches on rank i (2p once
    m >= 2p - 1, balanced), no W pending at the peak (each I is followed by its W until the cool-down)."""
    orders = _orders("ScheduleZBVZeroBubble", pp=pp, m=m, v=2)
    got = [_peak(orders[rank]) for rank in range(pp)]
    assert got == [(min(2 * m, m + r + 1, 2 * pp), 0) for r in range(pp)]
    assert [(Fraction(c, 2), w) for c, w in got] == [
        (in_flight("zbv", rank=r, pp=pp, micro_batches=m, chunks=2), w_held("zbv", rank=r, pp=pp, micro_batches=m))
        for r in range(pp)]


@pytest.mark.parametrize("pp, m", [(2, 4), (2, 8), (4, 8), (4, 12), (8, 16)])
def test_dualpipev_in_flight_is_torchs(pp, m):
    """torch's ScheduleDualPipeV (m >= 2p): 2p + 1 chunk micro-batches on every rank, p + 1/2 rank
    micro-batches (the DualPipe README's PP + 1 chunks), no W pending at the peak."""
    cls = schedules.ScheduleDualPipeV
    sched = cls.__new__(cls)
    sched.pp_group_size, sched._n_microbatches = pp, m
    got = [_peak(sched._calculate_single_rank_operations(rank)) for rank in range(pp)]
    assert got == [(2 * pp + 1, 0)] * pp
    assert all(in_flight("dualpipev", rank=r, pp=pp, micro_batches=m, chunks=2) == Fraction(2 * pp + 1, 2)
               and w_held("dualpipev", rank=r, pp=pp, micro_batches=m) == 0 for r in range(pp))


def test_zb_2p_fills_its_memory_limit_with_deferred_w():
    """ZB-2p (no torch class; the paper's heuristic) by hand, p 4, m 12, a micro-batch's activations
    M_B = 100 bytes, a deferred W's M_W = 37: rank i holds 2 (p - i) - 1 = 7, 5, 3, 1 in flight and defers
    W into what is left of 2p M_B = 800: (800 - 700) // 37 = 2, 300 // 37 = 8 (of the 7 left: 7),
    500 // 37 = 13 (9 left: 9), 700 // 37 = 18 (11 left: 11)."""
    got = [(in_flight("zb_2p", rank=r, pp=4, micro_batches=12),
            w_held("zb_2p", rank=r, pp=4, micro_batches=12, micro_batch_bytes=100, w_bytes=37)) for r in range(4)]
    assert got == [(7, 2), (5, 7), (3, 9), (1, 11)]
    assert w_held("zb_h2", rank=3, pp=4, micro_batches=12, micro_batch_bytes=100, w_bytes=37) == 0  # W after B
