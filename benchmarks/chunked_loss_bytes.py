"""What a chunked cross-entropy allocates on real tensors, eager and compiled, with the logits made in the loss or
by the model: the check of ``advisor.estimate.activations_loss.chunked_loss_bytes``.

    PYTHONPATH=$PWD python benchmarks/chunked_loss_bytes.py [--tokens 1024]

Each form runs a step of the loss over bf16 hidden states and a bf16 head on this machine's CPU (inductor's CPU
backend for the compiled ones), under the profiler's allocation records (``profile_memory``: every allocation and
free of the CPU allocator, in order, read from kineto's raw events), once to compile and once measured. Printed:
the bytes live at the forward's peak and the loss backward's peak beyond the inputs, and the estimate's two figures
beside them. The forms are torchtune's: ``LinearCrossEntropyLoss`` (the chunk's projection and cross-entropy in one
compiled function, ``chunked_compiled``), ``CEWithChunkedOutputLoss`` over the logits the model returned
(``chunked_held``, ``chunked_compiled_held``), and wrappers.losses' eager kernel (``chunked``, and with ``logits_first`` the eager ``chunked_held``). The backward's
figure includes the hidden-state chunks' gradients, which the estimate counts elsewhere (the blocks' side): the
report prints them apart (2 x tokens x width x 2 bytes at most: the chunks' gradients and their concatenation).
A few seconds a form.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

CHUNKS = 8
KERNELS = ("chunked", "chunked_held", "chunked_compiled", "chunked_compiled_held")
SHAPES = ((2048, 512), (4096, 64), (4096, 1024), (8192, 512), (8192, 2048))  # (vocabulary, width)


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="sum")


def _linear_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="sum")


def measure(kernel: str, *, tokens: int, vocab: int, width: int, head_trains: bool) -> tuple[int, int]:
    """(forward peak, loss backward peak) bytes beyond the inputs of one step of ``kernel``."""
    from torch.profiler import ProfilerActivity, profile

    from wrappers.losses import chunked_cross_entropy

    torch._dynamo.reset()
    compiled = "compiled" in kernel
    ce, linear_ce = (torch.compile(_ce), torch.compile(_linear_ce)) if compiled else (_ce, _linear_ce)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, dtype=torch.bfloat16, requires_grad=head_trains)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    marker = 7  # an allocation of 7 bytes marks the end of the forward

    def step() -> None:
        if not compiled:  # the kernel the simulator and wrap() run (each chunk's logits made first when held)
            loss = chunked_cross_entropy(hidden, lambda part: F.linear(part, weight), labels, CHUNKS,
                                         logits_first=kernel.endswith("held"))
        elif kernel.endswith("held"):  # the model returns every chunk's logits, then the loss reads them
            logits = [F.linear(part, weight) for part in hidden.chunk(CHUNKS)]
            loss = sum(ce(chunk, want) for chunk, want in zip(logits, labels.chunk(CHUNKS)))
            del logits
        else:  # the projection inside the compiled function
            loss = sum(linear_ce(part, weight, want) for part, want in zip(hidden.chunk(CHUNKS), labels.chunk(CHUNKS)))
        flag = torch.empty(marker, dtype=torch.uint8)
        loss.backward()
        del flag

    with torch._inductor.config.patch(fx_graph_cache=False):
        step()  # compiles
        hidden.grad = weight.grad = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    return forward_backward_peaks(prof, marker)


def forward_backward_peaks(prof, marker: int) -> tuple[int, int]:
    """(forward peak, backward peak) bytes live under ``prof`` (``profile_memory``: kineto's raw allocation records,
    in order), the forward ending at the allocation of ``marker`` bytes, which the backward's figure leaves out."""
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


def rows(tokens: int, shapes=SHAPES, kernels=KERNELS):
    """(kernel, vocabulary, width, head trains, measured forward, measured backward, estimated forward,
    estimated backward) per form and shape."""
    from advisor.estimate.activations import Dtypes
    from advisor.estimate.activations_loss import chunked_loss_bytes

    dt = Dtypes(residual=2, compute=2, input_casts=False)
    for vocab, width in shapes:
        for head_trains in (False, True):
            for kernel in kernels:
                measured = measure(kernel, tokens=tokens, vocab=vocab, width=width, head_trains=head_trains)
                estimated = chunked_loss_bytes(kernel, tokens=tokens, vocab=vocab, hidden=width, dt=dt,
                                               head_grads=head_trains)
                yield kernel, vocab, width, head_trains, *measured, *estimated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    print(f"tokens {args.tokens}, bf16; bytes; 'hidden grads' = 2 x tokens x width x 2, the most the hidden-state "
          "chunks' gradients add to the measured backward")
    print(f"{'kernel':22s} {'vocab':>6s} {'width':>6s} {'head':>6s} {'fwd meas':>11s} {'fwd est':>11s} "
          f"{'bwd meas':>11s} {'bwd est':>11s} {'hidden grads':>12s}")
    for kernel, vocab, width, trains, fwd, bwd, efwd, ebwd in rows(args.tokens):
        print(f"{kernel:22s} {vocab:>6d} {width:>6d} {'trains' if trains else 'frozen':>6s} {fwd:>11,d} {efwd:>11,d} "
              f"{bwd:>11,d} {ebwd:>11,d} {2 * args.tokens * width * 2:>12,d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
