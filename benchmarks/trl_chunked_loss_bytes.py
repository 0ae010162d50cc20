"""What TRL's ``chunked_nll`` loss (the SFTTrainer default since TRL 1.4.0; the trainer recipe's --loss chunked)
allocates on real tensors, against the estimate (``advisor.estimate.activations_loss.chunked_nll_bytes``) and against
the full-logits loss (transformers' ForCausalLMLoss, --loss hf).

    PYTHONPATH=$PWD python benchmarks/trl_chunked_loss_bytes.py            # the estimate against the measurement
    PYTHONPATH=$PWD python benchmarks/trl_chunked_loss_bytes.py --hf       # beside the full logits, larger shapes

The algorithm, as trl/trainer/sft_trainer.py ``_chunked_cross_entropy_loss`` and ``_chunk`` run it
(huggingface/trl@f2cd577), is ``wrappers.losses.checkpointed_cross_entropy`` (no TRL import: the tool does not
depend on it): the counted tokens packed to the front in one copy of the hidden states, then 256-token chunks, each
chunk's logits computed as ``hidden.float() @ weight.float().t()``, their log-softmax, NLL, argmax and entropy, under
``torch.utils.checkpoint`` (non-reentrant), so a chunk's tensors live only while it runs, in forward and again in
backward. Measured on this machine's CPU under the profiler's allocation records (``profile_memory``), as
``benchmarks/chunked_loss_bytes.py`` measures the tool's own kernels, with CUDA's autocast op list
(``advisor.simulate.autocast.cuda_fp32_policy``: on a GPU log_softmax, exp and sum run in fp32), in the setups
``SETUPS`` names. Printed per shape: the bytes live at the forward's peak and at the loss backward's peak beyond the
inputs, the latter less the hidden states' gradient (the estimate leaves it to the blocks' side), measured and
estimated. A few seconds a shape.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F

from chunked_loss_bytes import forward_backward_peaks  # benchmarks/: the same reading of the allocation records

# setup: (weights' and hidden states' dtype, autocast to bf16, the head trains); what each stands for
SETUPS = {
    "full": (torch.float32, True, True),  # fp32 weights under the Trainer's autocast: a full fine-tune on DDP or 1 GPU
    "fsdp": (torch.bfloat16, True, True),  # FSDP2's unsharded bf16 parameters under the Trainer's autocast
    "lora": (torch.bfloat16, True, False),  # a frozen bf16 LoRA base under the Trainer's autocast
    "bf16": (torch.bfloat16, False, True),  # pure bf16 or DeepSpeed: no autocast
    "bf16-frozen": (torch.bfloat16, False, False),
    "fp32": (torch.float32, False, True),
    "fp32-frozen": (torch.float32, False, False),
}
SHAPES = ((200, 4096, 1024), (512, 4096, 1024), (1024, 4096, 1024), (512, 4096, 2048), (768, 6144, 1536))
HF_SHAPES = ((512, 32768, 1024), (2048, 32768, 1024), (8192, 32768, 1024))


def chunked_nll(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from wrappers.losses import checkpointed_cross_entropy

    return checkpointed_cross_entropy(hidden, weight, labels)


def full_logits(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="sum")


def measure(loss_fn, *, tokens: int, vocab: int, width: int, setup: str = "full") -> tuple[int, int]:
    """(forward peak, loss backward peak) bytes beyond the inputs of one step of ``loss_fn`` in ``setup``, the
    backward's less the hidden states' gradient."""
    from torch.profiler import ProfilerActivity, profile

    from advisor.simulate.autocast import cuda_fp32_policy

    dtype, autocast, trains = SETUPS[setup]
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, dtype=dtype, requires_grad=trains)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    marker = 7  # an allocation of 7 bytes marks the end of the forward
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with cuda_fp32_policy(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with cast:
            loss = loss_fn(hidden, weight, labels)
        flag = torch.empty(marker, dtype=torch.uint8)
        loss.backward()
        del flag
    forward, backward = forward_backward_peaks(prof, marker)
    return forward, backward - hidden.numel() * hidden.element_size()


def estimate(*, tokens: int, vocab: int, width: int, setup: str) -> tuple[int, int]:
    from advisor.estimate.activations import Dtypes
    from advisor.estimate.activations_loss import chunked_nll_bytes

    dtype, autocast, trains = SETUPS[setup]
    size = 4 if dtype == torch.float32 else 2
    dt = Dtypes(residual=size, compute=2 if autocast else size, input_casts=autocast and size == 4)
    return chunked_nll_bytes("chunked_nll_autocast" if autocast else "chunked_nll", tokens=tokens, vocab=vocab,
                             hidden=width, dt=dt, head_trains=trains)


def rows(setups=tuple(SETUPS), shapes=SHAPES):
    """(setup, tokens, vocabulary, width, measured forward, measured backward, estimated forward, estimated backward)."""
    for setup in setups:
        for tokens, vocab, width in shapes:
            shape = dict(tokens=tokens, vocab=vocab, width=width, setup=setup)
            yield (setup, tokens, vocab, width, *measure(chunked_nll, **shape), *estimate(**shape))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", action="store_true", help="beside the full logits' loss, at longer micro-batches")
    args = parser.parse_args()
    mib = 2**20
    if args.hf:
        print("MiB beyond the inputs (backward: less the hidden states' gradient)")
        print(f"{'setup':>11s} {'tokens':>7s} {'vocab':>6s} {'width':>6s} {'trl fwd':>8s} {'trl bwd':>8s} "
              f"{'hf fwd':>8s} {'hf bwd':>8s}")
        for setup in ("full", "lora"):
            for tokens, vocab, width in HF_SHAPES:
                shape = dict(tokens=tokens, vocab=vocab, width=width, setup=setup)
                trl, hf = measure(chunked_nll, **shape), measure(full_logits, **shape)
                print(f"{setup:>11s} {tokens:>7d} {vocab:>6d} {width:>6d} {trl[0] / mib:>8.1f} {trl[1] / mib:>8.1f} "
                      f"{hf[0] / mib:>8.1f} {hf[1] / mib:>8.1f}", flush=True)
        return 0
    print("MiB beyond the inputs (backward: less the hidden states' gradient); error = estimated / measured - 1")
    print(f"{'setup':>11s} {'tokens':>7s} {'vocab':>6s} {'width':>6s} {'fwd':>8s} {'est':>8s} {'err':>6s} "
          f"{'bwd':>8s} {'est':>8s} {'err':>6s}")
    for setup, tokens, vocab, width, fwd, bwd, est_fwd, est_bwd in rows():
        print(f"{setup:>11s} {tokens:>7d} {vocab:>6d} {width:>6d} {fwd / mib:>8.2f} {est_fwd / mib:>8.2f} "
              f"{(est_fwd / fwd - 1) * 100:>+5.1f}% {bwd / mib:>8.2f} {est_bwd / mib:>8.2f} "
              f"{(est_bwd / bwd - 1) * 100:>+5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
