"""Measure the HBM bytes a Llama decoder block's elementwise and reduction kernels move, eager and compiled.

    PYTHONPATH=$PWD python benchmarks/compile_bytes.py            # eager trace + inductor, writes results/compile_bytes.md

The check of ``advisor.estimate.compile_time`` (whose op lists are counted by hand from the model code):

- eager: one transformers ``LlamaDecoderLayer`` in bf16 (SDPA), forward and backward under a
  ``TorchDispatchMode`` that logs every aten op; matmuls, attention kernels and views are left out
  (the same in both modes), every other op is charged its inputs' and outputs' bytes;
- compiled: the same layer through ``torch.compile`` (inductor, on this machine's CPU backend), with
  inductor's own count of the bytes each scheduled kernel reads and writes (``GraphLowering.count_bytes``,
  the figure its ``inductor_metrics`` log prints), extern kernels (matmuls, attention) left out.

Each is run at two token counts and differenced, so per-kernel constants (the norm weights, their
gradients) drop out and what remains is bytes per token of one block. CPU inductor fuses as the GPU
backend does at the scheduler level (both fuse pointwise ops into their neighbours and reductions
with their pointwise prologue/epilogue); its kernel boundaries can differ, which this check reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2)
SKIP = ("mm", "addmm", "bmm", "matmul", "linear", "_scaled_dot_product", "scaled_dot_product", "view", "_unsafe_view",
        "transpose", "t", "expand", "unsqueeze", "squeeze", "slice", "select", "as_strided", "detach", "alias",
        "permute", "split", "reshape", "_reshape_alias", "empty", "empty_like", "zeros", "ones", "new_empty",
        "new_zeros", "lift_fresh", "clone_view", "unbind")


_FORWARD_OPS = 30  # the traced forward's ops (two norms of 8, two RoPEs of 5, two adds, silu, product)


def _bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):  # distinct elements: an expanded (stride 0) dimension is read once
        distinct = 1
        for size, stride in zip(obj.shape, obj.stride()):
            distinct *= size if stride else 1
        return distinct * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(o) for o in obj)
    return 0


class ByteLog(TorchDispatchMode):
    """Sums input + output bytes of every op not in SKIP; keeps (name, bytes) per op."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not any(name == s or name.startswith(s + "_") or name.startswith("_scaled_dot") or "flash" in name
                   or "efficient_attention" in name for s in SKIP):
            self.ops.append((name, _bytes(list(args)) + _bytes(list((kwargs or {}).values())) + _bytes(out)))
        return out


def _layer(dtype=torch.bfloat16):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**SHAPE, num_hidden_layers=1, vocab_size=128, attn_implementation="sdpa")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, layer_idx=0).to(dtype)
    return layer, LlamaRotaryEmbedding(config), config


def _inputs(rope, tokens: int, dtype=torch.bfloat16):
    x = torch.randn(1, tokens, SHAPE["hidden_size"], dtype=dtype, requires_grad=True)
    pos = torch.arange(tokens)[None]
    cos, sin = rope(x, pos)
    return x, (cos.detach(), sin.detach()), pos


def eager_bytes(tokens: int, dtype=torch.bfloat16) -> tuple[int, list[tuple[str, int]]]:
    layer, rope, _ = _layer(dtype)
    x, emb, pos = _inputs(rope, tokens, dtype)
    log = ByteLog()
    with log:
        out = layer(x, position_embeddings=emb, position_ids=pos)
        out.backward(torch.ones_like(out))
    return sum(b for _, b in log.ops), log.ops


def compiled_bytes(tokens: int, dtype=torch.bfloat16) -> int:
    import torch._inductor.graph as graph
    from torch._inductor.scheduler import ExternKernelSchedulerNode

    totals: list[int] = []
    original = graph.GraphLowering.count_bytes

    def count(self):
        num, counts, runtimes = original(self)
        totals.append(sum(n.get_read_write_buffers_sizes() for n in self.scheduler.nodes
                          if not isinstance(n, ExternKernelSchedulerNode)))
        return num, counts, runtimes

    graph.GraphLowering.count_bytes = count
    torch._logging.set_logs(inductor_metrics=True)
    torch._inductor.config.fx_graph_cache = False  # a cached graph is not lowered again, so not counted
    torch._functorch.config.enable_autograd_cache = False
    try:
        torch._dynamo.reset()
        layer, rope, _ = _layer(dtype)
        compiled = torch.compile(layer, fullgraph=True)
        x, emb, pos = _inputs(rope, tokens, dtype)
        out = compiled(x, position_embeddings=emb, position_ids=pos)
        out.backward(torch.ones_like(out))
    finally:
        graph.GraphLowering.count_bytes = original
        torch._logging.set_logs()
    return sum(totals)


def _check(dtype, small: int = 256, large: int = 512) -> tuple[list[str], list[tuple[str, int]]]:
    """Lines comparing the trace and inductor's count with the hand count at ``dtype``."""
    from advisor.estimate.compile_time import block_bytes  # the hand count it checks

    e_small, ops_small = eager_bytes(small, dtype)
    e_large, ops = eager_bytes(large, dtype)
    per = large - small
    eager = (e_large - e_small) / per
    fwd = (sum(b for _, b in ops[:_FORWARD_OPS]) - sum(b for _, b in ops_small[:_FORWARD_OPS])) / per
    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    hand = block_bytes(hidden=SHAPE["hidden_size"], intermediate=SHAPE["intermediate_size"],
                       q_width=SHAPE["hidden_size"], kv_width=head_dim * SHAPE["num_key_value_heads"],
                       head_dim=head_dim, activation_bytes=torch.empty(0, dtype=dtype).element_size())
    lines = [f"{dtype}:", "",
             f"- eager, traced (forward + backward): {eager:,.0f} bytes a token" +
             (f" (forward {fwd:,.0f}, backward {eager - fwd:,.0f})" if dtype == torch.bfloat16 else ""),
             f"- eager, counted by hand (advisor.estimate.compile_time): {hand.eager:,} bytes a token "
             f"(forward {hand.eager_forward:,}, backward {hand.eager_backward:,})"]
    try:
        compiled = (compiled_bytes(large, dtype) - compiled_bytes(small, dtype)) / per
        lines.append(f"- compiled, inductor's count (CPU backend): {compiled:,.0f} bytes a token (it also copies the "
                     f"attention's logsumexp, 8 x heads = {8 * SHAPE['num_attention_heads']} bytes, a CPU "
                     "fallback kernel's, not counted by hand)")
    except Exception as err:  # no compiler on this machine: report it
        lines.append(f"- compiled: inductor failed here ({type(err).__name__}: {str(err).splitlines()[0][:120]})")
    lines += [f"- compiled, counted by hand: {hand.compiled:,} bytes a token (forward {hand.compiled_forward:,}, "
              f"backward {hand.compiled_backward:,})", ""]
    return lines, ops


def main() -> int:
    lines = [f"# Elementwise and reduction bytes of one Llama block, per token (shape {SHAPE})", "",
             f"Generated by `PYTHONPATH=$PWD python benchmarks/compile_bytes.py` (torch {torch.__version__}).", ""]
    ops: list[tuple[str, int]] = []
    for dtype in (torch.bfloat16, torch.float32):
        found, traced = _check(dtype)
        lines += found
        ops = ops or traced
    lines += ["Eager ops traced at 512 tokens, bf16 (name: bytes):", ""]
    lines += [f"    {name}: {b:,}" for name, b in ops]
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results" / "compile_bytes.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
