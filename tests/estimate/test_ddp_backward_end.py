"""A replicated step's end of backward (DDP, ``advisor.estimate.strategy_buffers._replicated_backward_end``),
worked by hand on the tiny Llamas of ``test_backward_end`` and measured on the simulated step. CPU only.

The tiny Llama: hidden 64, 2 blocks of L = 46,208, vocabulary 8,192, so a vocabulary-sized matrix is
E = 8,192 x 64 = 524,288; tied, P = 92,416 + 524,288 + 64 (final norm) = 616,768. DDP on 2 ranks,
bf16-mixed (fp32 weights under autocast), fused AdamW (no step temporaries), micro-batch 1, seq 8.
"""

from __future__ import annotations


import pytest

from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import spec_from_config
from advisor.simulate.step import simulate
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.estimate.test_backward_end import TIED, TINY

E = 8_192 * 64


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


def _training() -> TrainingConfig:
    return TrainingConfig(seq_len=8, optimizer_impl="fused")


def _estimate(cfg: dict):
    spec = spec_from_config(cfg, name=cfg["_name_or_path"], source="local")
    return estimate_memory(spec, parse_gpus("2xH100"), _training(), get_strategy("ddp").on("torch"),
                           micro_batch_size=1, checkpointing=False)


def _simulate(cfg: dict):
    return simulate(cfg, world_size=2, strategy="ddp", training=_training(), micro_batch_size=1,
                    checkpointing=False, timeline=True)


def test_tied_end_of_backward_by_hand():
    """At the embedding's backward: fp32 weights 4P = 2,467,072, AdamW's moments 8P = 4,934,144, DDP's
    buckets 4P = 2,467,072, every gradient but the shared matrix's 4(P - E) = 369,920, and two fp32
    vocabulary-sized gradients, the head's (autocast's fresh fp32 copy of its bf16 gradient, waiting in
    autograd's input buffer) and the embedding's, 2 x 4E = 4,194,304 (the engine sums them in place). Sum 14,432,512,
    above the fused step's 20P = 12,335,360, which was the estimate's peak before."""
    est = _estimate(TIED)
    assert est.at_end_of_backward == 14_432_512
    assert est.at_optimizer_step == 12_335_360
    assert est.peak_moment == "end_of_backward"
    assert (est.params, est.grads, est.optimizer, est.activations, est.temporary) == (
        2_467_072, 369_920, 4_934_144, 0, 2_467_072 + 4_194_304)


def test_tied_end_of_backward_against_the_simulated_step():
    """The simulated peak is the embedding's backward and holds the two fp32 vocabulary-sized gradients the
    hand count holds, summed in place as a GPU sums them (``advisor.simulate.cuda_kernels.
    cuda_grad_accumulation``; before it, fake tensors, a tensor subclass that torch/csrc/autograd/input_buffer.cpp
    ``can_accumulate_inplace`` refuses, summed out of place: one 4E = 2,097,152 bytes more). The rest, 2,264
    bytes: the embedding output's fp32 gradient, 8 x 64 x 4 = 2,048, RoPE's buffer, AdamW's step counters
    and the ids."""
    sim = _simulate(TIED)
    est = _estimate(TIED)
    peak = max(sim.timeline.segments, key=lambda s: s.peak.total)
    assert (peak.phase, peak.label) == ("backward", "embed_tokens")
    assert peak.peak.total == sim.peak_allocated
    assert peak.peak.grads == 369_920  # every gradient but the shared matrix's, as worked above
    assert sim.peak_allocated - est.at_end_of_backward == 2_264, (sim.peak_allocated, est)


def test_tied_without_autocast_sums_out_of_place_by_hand_and_simulated():
    """fp32 without autocast: the head's gradient reaches the tied matrix as the matmul's transposed view,
    which autograd does not sum into in place, so three fp32 vocabulary-sized gradients are live,
    3 x 4E = 6,291,456: 2,467,072 + 369,920 + 4,934,144 + 2,467,072 + 6,291,456 = 16,529,664. The
    simulated step agrees (it sums in place only where a GPU does)."""
    training = TrainingConfig(seq_len=8, optimizer_impl="fused", precision="fp32")
    spec = spec_from_config(TIED, name="tied", source="local")
    est = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy("ddp").on("torch"),
                          micro_batch_size=1, checkpointing=False)
    assert est.at_end_of_backward == 16_529_664
    assert est.peak_moment == "end_of_backward"
    sim = simulate(TIED, world_size=2, strategy="ddp", training=training, micro_batch_size=1, checkpointing=False)
    assert 0 <= sim.peak_allocated - est.peak_allocated <= 1_000, (sim.peak_allocated, est)


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "fp32"])
def test_autograd_sums_a_tied_gradient_in_place_only_after_a_cast(autocast):
    """The mechanism, with real tensors (no tracker): the gradient the tied matrix's AccumulateGrad
    receives is the head's own storage (summed in place) under autocast, where the head's gradient is
    the cast node's fresh fp32 copy, and a new tensor without autocast, where it is a transposed view
    (torch/csrc/autograd/input_buffer.cpp ``can_accumulate_inplace``). If a torch release changes this,
    ``_replicated_backward_end``'s count of vocabulary-sized gradients changes with it."""
    import torch
    import torch.nn.functional as F

    weight = torch.nn.Parameter(torch.randn(512, 64))
    ids = torch.randint(0, 512, (16,))
    pointers: dict[str, int] = {}
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with cast:
        logits = F.linear(F.embedding(ids, weight), weight)
    loss = logits.float().square().mean()
    node, stack = None, [loss.grad_fn]
    while stack:  # the head's last node before the matrix's AccumulateGrad
        node = stack.pop()
        nexts = [n for n, _ in node.next_functions if n is not None]
        if node.name() != "EmbeddingBackward0" and any(n.name() == "torch::autograd::AccumulateGrad" for n in nexts):
            break
        stack.extend(n for n in nexts if n.name() != "torch::autograd::AccumulateGrad")
    assert node.name() == ("ToCopyBackward0" if autocast else "TBackward0")
    node.register_hook(lambda grad_in, grad_out: pointers.setdefault("head", grad_in[0].data_ptr()) and None)
    weight.register_hook(lambda grad: pointers.setdefault("summed", grad.data_ptr()) and None)
    loss.backward()
    assert (pointers["summed"] == pointers["head"]) is autocast


def test_untied_end_of_backward_is_every_gradient():
    """Untied (P = 1,141,056): the head's gradient is already in its ``.grad`` and the embedding's is the
    last one computed, so the end of backward holds every gradient, 4P = 4,564,224, beside the weights,
    moments and buckets: 20P = 22,821,120, the fused step's figure (the tie goes to the optimizer step).
    The simulated step peaks there, 2,268 bytes higher (the embedding output's fp32 gradient, 8 x 64 x 4 =
    2,048, RoPE's buffer, the step counters, the ids)."""
    est = _estimate(TINY)
    assert est.at_end_of_backward == est.at_optimizer_step == 22_821_120
    assert est.peak_moment == "optimizer_step"
    sim = _simulate(TINY)
    assert 0 <= sim.peak_allocated - est.peak_allocated <= 3_000, (sim.peak_allocated, est)


def test_lora_has_no_replicated_end_of_backward():
    """A frozen embedding gets no gradient (LoRA): the moment is not estimated."""
    from advisor.model.lora import with_lora

    training = TrainingConfig(seq_len=8, optimizer_impl="fused", lora=16)
    spec = with_lora(spec_from_config(TIED, name="tied", source="local"), training.lora)
    est = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy("ddp").on("torch"),
                          micro_batch_size=1, checkpointing=False)
    assert est.at_end_of_backward is None
