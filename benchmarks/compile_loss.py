"""What a compiled cross-entropy allocates: the buffers inductor's generated code makes for
``F.cross_entropy(logits.float(), labels)`` (torchtitan's loss, compiled under --compile), forward and backward.

    PYTHONPATH=$PWD python benchmarks/compile_loss.py [--tokens 512 --vocab 4096]

The check of ``advisor.estimate.activations_loss.compiled_loss_bytes``: the eager loss makes an fp32 copy of the
logits, a saved fp32 log-softmax and fp32 gradients (10 bytes a logit at the end of forward, 12 in its backward, in
bf16); compiled, inductor's forward allocates only per-token reductions (the row max and the log of the sum of
exponentials) and saves the logits themselves, and its backward writes one gradient in the logits' dtype. This
script compiles the function on this machine's CPU backend (``torch._inductor.utils.run_and_get_code``, forward
and backward), lists every ``empty_strided`` the generated code makes and what the forward returns, and prints
the bytes a logit the estimate counts beside them. A few seconds.
"""

from __future__ import annotations

import argparse
import re
import sys

import torch
import torch.nn.functional as F

ALLOC = re.compile(r"(buf\d+) = empty_strided_\w+\(\(([\d, ]*)\), \([\d, ]*\), torch\.(\w+)\)")


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def compiled_buffers(tokens: int, vocab: int, dtype: torch.dtype = torch.bfloat16) -> list[list[tuple[str, tuple, str]]]:
    """Per generated graph (forward, then backward): (buffer, shape, dtype) of every allocation."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    logits = torch.randn(tokens, vocab, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    compiled = torch.compile(cross_entropy)

    def step():
        compiled(logits, labels).backward()

    with torch._inductor.config.patch(fx_graph_cache=False):
        _, codes = run_and_get_code(step)
    return [[(name, tuple(int(d) for d in shape.replace(" ", "").split(",") if d), kind)
             for name, shape, kind in ALLOC.findall(code)] for code in codes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()
    from advisor.estimate.activations import Dtypes
    from advisor.estimate.activations_loss import compiled_loss_bytes, loss_bytes

    graphs = compiled_buffers(args.tokens, args.vocab)
    for label, buffers in zip(("forward", "backward"), graphs):
        print(f"{label}: " + ", ".join(f"{name} {shape} {kind}" for name, shape, kind in buffers))
    dt = Dtypes(residual=2, compute=2, input_casts=False)
    logits = args.tokens * args.vocab
    eager = loss_bytes("hf", tokens=args.tokens, vocab=args.vocab, hidden=0, dt=dt)
    compiled = compiled_loss_bytes(tokens=args.tokens, vocab=args.vocab, dt=dt)
    print(f"estimate, bytes a logit (end of forward, loss backward): eager {eager[0] / logits:.3f}, "
          f"{eager[1] / logits:.3f}; compiled {compiled[0] / logits:.3f}, {compiled[1] / logits:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
