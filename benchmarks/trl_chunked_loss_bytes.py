"""What TRL's ``chunked_nll`` loss (the SFTTrainer default since TRL 1.4.0) allocates on real tensors, against the
full-logits loss the plan counts in its place: the figures behind the note an SFTConfig file gets
(``advisor.planning.config_trainer``), which the planner does not model.

    PYTHONPATH=$PWD python benchmarks/trl_chunked_loss_bytes.py

The algorithm, as trl/trainer/sft_trainer.py ``_chunked_cross_entropy_loss`` describes it (huggingface/trl@f2cd577):
the valid tokens in chunks of 256, each chunk's logits computed as ``hidden.float() @ weight.float().t()`` with its
log-softmax and NLL under ``torch.utils.checkpoint`` (non-reentrant), so a chunk's tensors live only while it runs,
in forward and again in backward. Written here from that description (no TRL import: the tool does not depend on
it), over bf16 hidden states and a bf16 head, no autocast, on this machine's CPU, under the profiler's allocation
records (``profile_memory``), as ``benchmarks/chunked_loss_bytes.py`` measures the tool's own kernels. Printed per
shape: the bytes live at the forward's peak and at the loss backward's peak beyond the inputs, for this loss and for
``F.cross_entropy(F.linear(hidden, weight).float(), labels)`` (transformers' ForCausalLMLoss, the plan's ``--loss
hf``), the head training and frozen. The head's fp32 copy (``weight.float()``: vocabulary x width x 4 bytes) is made
for every chunk and, in backward, its fp32 gradient beside it: where a micro-batch has fewer tokens than about the
model's width, TRL's loss holds more than the full logits do; with more, far less. A few seconds a shape.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK = 256  # trl/trainer/sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE
SHAPES = ((512, 32768, 1024), (2048, 32768, 1024), (8192, 32768, 1024), (1024, 16384, 2048), (4096, 16384, 2048))


def _chunk_nll(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = hidden.float() @ weight.float().t()
    return F.nll_loss(F.log_softmax(logits, dim=-1), labels, reduction="sum")


def chunked_nll(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    loss = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], CHUNK):
        loss = loss + checkpoint(_chunk_nll, hidden[start:start + CHUNK], weight, labels[start:start + CHUNK],
                                 use_reentrant=False)
    return loss


def full_logits(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="sum")


def measure(loss_fn, *, tokens: int, vocab: int, width: int, head_trains: bool) -> tuple[int, int]:
    """(forward peak, loss backward peak) bytes beyond the inputs of one step of ``loss_fn``."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, dtype=torch.bfloat16, requires_grad=head_trains)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    marker = 7  # an allocation of 7 bytes marks the end of the forward
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = loss_fn(hidden, weight, labels)
        flag = torch.empty(marker, dtype=torch.uint8)
        loss.backward()
        del flag
    records = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                     key=lambda e: e.start_ns())
    live, forward, backward, in_forward = 0, 0, 0, True
    for record in records:
        live += record.nbytes()
        if in_forward and record.nbytes() == marker:
            in_forward = False
            continue
        if in_forward:
            forward = max(forward, live)
        else:
            backward = max(backward, live - marker if live >= marker else live)
    return forward, backward


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    mib = 2**20
    print("bf16 hidden states and head, no autocast; MiB beyond the inputs; 'head fp32' = vocabulary x width x 4")
    print(f"{'tokens':>7s} {'vocab':>6s} {'width':>6s} {'head':>6s} {'head fp32':>9s} {'trl fwd':>8s} {'trl bwd':>8s} "
          f"{'hf fwd':>8s} {'hf bwd':>8s}")
    for tokens, vocab, width in SHAPES:
        for trains in (True, False):
            trl = measure(chunked_nll, tokens=tokens, vocab=vocab, width=width, head_trains=trains)
            hf = measure(full_logits, tokens=tokens, vocab=vocab, width=width, head_trains=trains)
            print(f"{tokens:>7d} {vocab:>6d} {width:>6d} {'trains' if trains else 'frozen':>6s} "
                  f"{vocab * width * 4 / mib:>9.0f} {trl[0] / mib:>8.0f} {trl[1] / mib:>8.0f} {hf[0] / mib:>8.0f} "
                  f"{hf[1] / mib:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
