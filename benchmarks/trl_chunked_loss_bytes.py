"""What TRL's ``chunked_nll`` loss (the SFTTrainer default since TRL 1.4.0) allocates on real tensors, against the
full-logits loss the plan counts in its place: the figures behind the note an SFTConfig file gets
(``advisor.planning.config_trainer``), which the planner does not model.

    PYTHONPATH=$PWD python benchmarks/trl_chunked_loss_bytes.py

The algorithm, as trl/trainer/sft_trainer.py ``_chunked_cross_entropy_loss`` and ``_chunk`` run it
(huggingface/trl@f2cd577): the valid tokens in chunks of 256, each chunk's logits computed as ``hidden.float() @
weight.float().t()``, their log-softmax, NLL, argmax and entropy, under ``torch.utils.checkpoint`` (non-reentrant),
so a chunk's tensors live only while it runs, in forward and again in backward. Written here from that description
(no TRL import: the tool does not depend on it), on this machine's CPU, under the profiler's allocation records
(``profile_memory``), as ``benchmarks/chunked_loss_bytes.py`` measures the tool's own kernels, in three setups:
``full`` (fp32 weights and hidden states under bf16 autocast: TRL loads a model id in float32 and the Trainer's bf16
autocasts, the plan's bf16-mixed), ``lora`` (a bf16 base under bf16 autocast: the head is frozen and bf16) and
``bf16`` (bf16 tensors, no autocast). Printed per shape: the bytes live at the forward's peak and at the loss
backward's peak beyond the inputs, for this loss and for ``F.cross_entropy(F.linear(hidden, weight).float(),
labels)`` (transformers' ForCausalLMLoss, the plan's ``--loss hf``). Every chunk casts the whole head weight (under
autocast a bf16 copy; a bf16 head is first copied to fp32) and, where the head trains, its backward holds a head-sized
gradient: below about as many tokens a micro-batch as the model's width, TRL's loss backward holds more than the full
logits do; above, far less. Not measured (a process group): FSDP2's ``full_tensor()`` of the whole head and ZeRO-3's
gather of it per chunk, which hold the unsharded head beside these. A few seconds a shape.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from chunked_loss_bytes import forward_backward_peaks  # benchmarks/: the same reading of the allocation records

CHUNK = 256  # trl/trainer/sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE
SHAPES = ((512, 32768, 1024), (2048, 32768, 1024), (8192, 32768, 1024), (1024, 16384, 2048), (4096, 16384, 2048))
# (weights and hidden states dtype, autocast to bf16): the three setups of the module docstring
SETUPS = {"full": (torch.float32, True), "lora": (torch.bfloat16, True), "bf16": (torch.bfloat16, False)}


def _chunk_nll(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor):
    logits = hidden.float() @ weight.float().t()
    log_p = F.log_softmax(logits, dim=-1)
    loss = F.nll_loss(log_p, labels, ignore_index=-100, reduction="sum")
    valid = labels != -100  # the accuracy and entropy TRL logs, over the valid tokens
    correct = ((logits.argmax(dim=-1) == labels) & valid).sum().float()
    entropy = (-(log_p.exp() * log_p).sum(dim=-1) * valid).sum()
    return loss, correct, entropy


def chunked_nll(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    loss = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], CHUNK):
        part, _, _ = checkpoint(_chunk_nll, hidden[start:start + CHUNK], weight, labels[start:start + CHUNK],
                                use_reentrant=False)
        loss = loss + part
    return loss


def full_logits(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="sum")


def measure(loss_fn, *, tokens: int, vocab: int, width: int, head_trains: bool, setup: str = "full") -> tuple[int, int]:
    """(forward peak, loss backward peak) bytes beyond the inputs of one step of ``loss_fn`` in ``setup``."""
    from torch.profiler import ProfilerActivity, profile

    dtype, autocast = SETUPS[setup]
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, dtype=dtype, requires_grad=head_trains)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    marker = 7  # an allocation of 7 bytes marks the end of the forward
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with cast:
            loss = loss_fn(hidden, weight, labels)
        flag = torch.empty(marker, dtype=torch.uint8)
        loss.backward()
        del flag
    return forward_backward_peaks(prof, marker)


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    mib = 2**20
    print("MiB beyond the inputs; 'head fp32' = vocabulary x width x 4; full: fp32 under bf16 autocast (the head "
          "trains), lora: bf16 under bf16 autocast (frozen), bf16: no autocast (both)")
    print(f"{'setup':>5s} {'tokens':>7s} {'vocab':>6s} {'width':>6s} {'head':>6s} {'head fp32':>9s} {'trl fwd':>8s} "
          f"{'trl bwd':>8s} {'hf fwd':>8s} {'hf bwd':>8s}")
    for setup, heads in (("full", (True,)), ("lora", (False,)), ("bf16", (True, False))):
        for tokens, vocab, width in SHAPES:
            for trains in heads:
                shape = dict(tokens=tokens, vocab=vocab, width=width, head_trains=trains, setup=setup)
                trl, hf = measure(chunked_nll, **shape), measure(full_logits, **shape)
                print(f"{setup:>5s} {tokens:>7d} {vocab:>6d} {width:>6d} {'trains' if trains else 'frozen':>6s} "
                      f"{vocab * width * 4 / mib:>9.0f} {trl[0] / mib:>8.0f} {trl[1] / mib:>8.0f} "
                      f"{hf[0] / mib:>8.0f} {hf[1] / mib:>8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
