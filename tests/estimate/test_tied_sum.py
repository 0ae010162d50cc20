"""Where a tied matrix's two gradients are summed in place (``advisor.estimate.strategy_buffers.tied_sum_in_place``):
the end of backward under the fused and chunked losses, worked by hand on the tiny tied Llama of
``test_backward_end``, measured on the simulated step (which sums in place where a GPU does:
``advisor.simulate.cuda_kernels``) and, for the mechanism, on real tensors. CPU only, no network.

The tiny tied Llama: hidden 64, 2 blocks of L = 46,208, vocabulary 8,192, so the shared matrix is
E = 8,192 x 64 = 524,288 and the root R = E + 64 (final norm) = 524,352; P = 92,416 + R = 616,768.
Fused AdamW (no step temporaries), micro-batch 1, seq 8.
"""

from __future__ import annotations


import pytest

from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import spec_from_config
from advisor.simulate.step import simulate
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from tests.estimate.test_backward_end import TIED

E = 8_192 * 64
WORLD = {"zero3": 8, "ddp": 2}


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


def _training(loss: str, precision: str) -> TrainingConfig:
    return TrainingConfig(seq_len=8, optimizer_impl="fused", loss=loss, precision=precision)


def _estimate(strategy: str, training: TrainingConfig):
    spec = spec_from_config(TIED, name=TIED["_name_or_path"], source="local")
    return estimate_memory(spec, parse_gpus(f"{WORLD[strategy]}xH100"), training, get_strategy(strategy).on("torch"),
                           micro_batch_size=1, checkpointing=strategy == "zero3")


def _embedding_backward(strategy: str, training: TrainingConfig) -> int:
    """The simulated step's peak in the embedding's backward (the last segment of backward)."""
    sim = simulate(TIED, world_size=WORLD[strategy], strategy=strategy, training=training, micro_batch_size=1,
                   checkpointing=strategy == "zero3", timeline=True)
    return max(s.peak.total for s in sim.timeline.segments if s.phase == "backward" and s.label == "embed_tokens")


def test_fsdp2_fused_fp32_end_of_backward_by_hand():
    """zero3 on 8 ranks in fp32 (the sweep's d2d4b920f98e, +18.6%, in small). Shards 4P/8 = 308,384, AdamW's
    moments 8P/8 = 616,768, both blocks' fp32 gradient shards 4 x 92,416/8 = 46,208. The embedding's backward:
    the unsharded root 4R = 2,097,408, two fp32 vocabulary-sized gradients, the head's (the fused kernel's
    fresh product, waiting in autograd's input buffer) and the embedding's, summed in place, 2 x 4E =
    4,194,304, the final norm's fp32 gradient 4 x 64 = 256, the last block's fp32 reduce-scatter input 4L =
    184,832: 6,476,800 (the root's reduce-scatter holds 8R = 4,194,816). Sum: 308,384 + 616,768 + 46,208 +
    6,476,800 = 7,448,160, the step's peak. Counted out of place, as before, it was one 4E = 2,097,152 more
    (+28% over the simulated step)."""
    est = _estimate("zero3", _training("fused", "fp32"))
    assert est.at_end_of_backward == 7_448_160
    assert est.peak_moment == "end_of_backward"


def test_ddp_fused_fp32_end_of_backward_by_hand():
    """DDP on 2 ranks in fp32 (no autocast): weights 4P = 2,467,072, moments 8P = 4,934,144, DDP's buckets
    4P = 2,467,072, every gradient but the shared matrix's 4(P - E) = 369,920, and the head's and the
    embedding's gradients summed in place 2 x 4E = 4,194,304: 14,432,512 (transformers' loss, whose head
    gradient is the matmul's transposed view, holds a third: 16,529,664, test_ddp_backward_end)."""
    est = _estimate("ddp", _training("fused", "fp32"))
    assert est.at_end_of_backward == 14_432_512
    assert est.peak_moment == "end_of_backward"


@pytest.mark.parametrize(("strategy", "loss", "precision"), [
    ("zero3", "fused", "fp32"), ("zero3", "fused", "bf16"), ("zero3", "chunked", "bf16-mixed"),
    ("zero3", "hf", "bf16"), ("ddp", "fused", "fp32"), ("ddp", "chunked", "bf16"),
])
def test_end_of_backward_matches_the_simulated_embedding_backward(strategy, loss, precision):
    """The estimate's end of backward against the simulated embedding's backward, within 3,000 bytes (the
    embedding output's gradient, RoPE's buffer, the step counters, the ids), where the tied sum is one
    vocabulary-sized matrix, 2E = 1,048,576 bytes in 16 bits or 4E in fp32: before, every fused and chunked
    row here was over by that matrix; transformers' loss (hf) sums out of place and keeps its third."""
    training = _training(loss, precision)
    est = _estimate(strategy, training).at_end_of_backward
    sim = _embedding_backward(strategy, training)
    assert 0 <= sim - est <= 3_000, (est, sim)


def test_the_fused_kernel_hands_the_tied_matrix_a_fresh_gradient():
    """The mechanism, with real tensors in fp32 (no autocast, no tracker): the gradient the tied matrix
    receives has the storage of the fused kernel's own weight gradient (``grad_weight * grad_loss``, a fresh
    tensor), so the embedding's was summed into it in place (torch/csrc/autograd/input_buffer.cpp
    ``can_accumulate_inplace``); transformers' loss hands the matrix a transposed view and gets a new tensor
    (test_ddp_backward_end). The chunked loss's head gradient, the chunks' own sum, is made inside the engine
    where no hook sees it: the simulated rows above measure it."""
    import torch
    import torch.nn.functional as F

    from wrappers.losses import fused_linear_cross_entropy

    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(512, 64))
    ids, targets = torch.randint(0, 512, (16,)), torch.randint(0, 512, (16,))
    loss = fused_linear_cross_entropy(F.embedding(ids, weight) * 1.5, weight, targets)
    pointers: dict[str, int] = {}
    node = loss.grad_fn
    while node.name() != "_FusedLinearCrossEntropyBackward":
        node = node.next_functions[0][0]
    node.register_hook(lambda grad_in, grad_out: pointers.setdefault("head", grad_in[1].data_ptr()) and None)
    weight.register_hook(lambda grad: pointers.setdefault("summed", grad.data_ptr()) and None)
    loss.backward()
    assert pointers["summed"] == pointers["head"]
