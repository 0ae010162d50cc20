"""Measure the HBM bytes a Llama decoder block's elementwise and reduction kernels move, eager and compiled.

    PYTHONPATH=$PWD python benchmarks/compile_bytes.py            # eager trace + inductor, writes results/compile_bytes.md
    PYTHONPATH=$PWD python benchmarks/compile_bytes.py --lora     # the LoRA section (needs peft), appended there

The check of ``advisor.estimate.compile_time`` (whose op lists are counted by hand from the model code):

- eager: one transformers ``LlamaDecoderLayer`` in bf16 (SDPA), forward and backward under a
  ``TorchDispatchMode`` that logs every aten op; matmuls, attention kernels and views are left out
  (the same in both modes), every other op is charged its inputs' and outputs' bytes;
- compiled: the same layer through ``torch.compile`` (inductor, on this machine's CPU backend), with
  inductor's own count of the bytes each scheduled kernel reads and writes (``GraphLowering.count_bytes``,
  the figure its ``inductor_metrics`` log prints), extern kernels (matmuls, attention) left out.

The LoRA section (``--lora``, the check of ``advisor.estimate.adapter_time``'s compiled counts): the same layer
with every weight frozen (a LoRA base: the norms run no weight gradients), then with PEFT adapters (rank 8, no
dropout, bf16) on one target at a time; what each adds to the eager trace and to inductor's forward and backward
graphs, against the hand counts; and every target at once on a wider block at rank 16, a shape the rule was not
read from.

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


def _layer(dtype=torch.bfloat16, shape: dict | None = None, lora: tuple[tuple[str, ...], int] | None = None):
    """The block; ``lora`` = (targets, rank): every weight frozen, PEFT adapters on ``targets`` (none: the frozen
    block alone)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**(shape or SHAPE), num_hidden_layers=1, vocab_size=128, attn_implementation="sdpa")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, layer_idx=0).to(dtype)
    if lora is not None:
        layer.requires_grad_(False)
        targets, rank = lora
        if targets:
            import peft

            holder = torch.nn.Module()
            holder.layer = layer  # inject_adapter_in_model wants a parent module
            peft.inject_adapter_in_model(peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets),
                                                         lora_dropout=0.0, init_lora_weights=False), holder)
            for name, param in layer.named_parameters():
                if "lora_" in name:
                    param.data = param.data.to(dtype)
    return layer, LlamaRotaryEmbedding(config), config


def _inputs(rope, tokens: int, dtype=torch.bfloat16, hidden: int | None = None):
    x = torch.randn(1, tokens, hidden or SHAPE["hidden_size"], dtype=dtype, requires_grad=True)
    pos = torch.arange(tokens)[None]
    cos, sin = rope(x, pos)
    return x, (cos.detach(), sin.detach()), pos


def eager_bytes(tokens: int, dtype=torch.bfloat16, **block) -> tuple[int, list[tuple[str, int]]]:
    layer, rope, config = _layer(dtype, **block)
    x, emb, pos = _inputs(rope, tokens, dtype, config.hidden_size)
    log = ByteLog()
    with log:
        out = layer(x, position_embeddings=emb, position_ids=pos)
        out.backward(torch.ones_like(out))
    return sum(b for _, b in log.ops), log.ops


def compiled_bytes(tokens: int, dtype=torch.bfloat16, **block) -> int:
    return sum(compiled_graph_bytes(tokens, dtype, **block))


def compiled_graph_bytes(tokens: int, dtype=torch.bfloat16, **block) -> list[int]:
    """Inductor's count for each graph it lowered: [forward, backward]."""
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
        layer, rope, config = _layer(dtype, **block)
        compiled = torch.compile(layer, fullgraph=True)
        x, emb, pos = _inputs(rope, tokens, dtype, config.hidden_size)
        out = compiled(x, position_embeddings=emb, position_ids=pos)
        out.backward(torch.ones_like(out))
    finally:
        graph.GraphLowering.count_bytes = original
        torch._logging.set_logs()
    return totals


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


WIDE = dict(hidden_size=384, intermediate_size=1024, num_attention_heads=6, num_key_value_heads=2)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _per_token(measure, small: int = 256, large: int = 512):
    """measure(tokens) -> a number or a list of numbers; their growth a token."""
    a, b = measure(small), measure(large)
    if isinstance(a, list):
        return [(y - x) / (large - small) for x, y in zip(a, b)]
    return (b - a) / (large - small)


def _adapters_by_hand(shape: dict, targets: tuple[str, ...], rank: int, *, compiled: bool) -> tuple[int, int]:
    """(forward, backward) elementwise bytes a token the hand counts give ``targets`` (the skinny GEMMs, extern
    kernels in both modes and skipped by the trace, taken out)."""
    from advisor.estimate.adapter_time import adapter_bytes_per_token

    hd = shape["hidden_size"] // shape["num_attention_heads"]
    fans = {"q_proj": (shape["hidden_size"], shape["hidden_size"]),
            "k_proj": (shape["hidden_size"], hd * shape["num_key_value_heads"]),
            "v_proj": (shape["hidden_size"], hd * shape["num_key_value_heads"]),
            "o_proj": (shape["hidden_size"], shape["hidden_size"]),
            "gate_proj": (shape["hidden_size"], shape["intermediate_size"]),
            "up_proj": (shape["hidden_size"], shape["intermediate_size"]),
            "down_proj": (shape["intermediate_size"], shape["hidden_size"])}
    fwd = bwd = 0
    for name in targets:
        i, o = fans[name]
        f, b = adapter_bytes_per_token(i, o, rank, compute_bytes=2, input_casts=False, dropout=False,
                                       compiled_as=name if compiled else None)
        fwd += f - 2 * (i + 2 * rank + o)
        bwd += b - 2 * (2 * i + 2 * o + 4 * rank)
    return fwd, bwd


def lora_lines() -> list[str]:
    """The LoRA section: the frozen block, each target's adapter, and every target on the wider block."""
    from advisor.estimate.compile_time import block_bytes

    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    hand = block_bytes(hidden=SHAPE["hidden_size"], intermediate=SHAPE["intermediate_size"], q_width=SHAPE["hidden_size"],
                       kv_width=head_dim * SHAPE["num_key_value_heads"], head_dim=head_dim, activation_bytes=2,
                       norm_weight_grads=False)
    frozen = dict(lora=((), 8))
    eager0 = _per_token(lambda t: eager_bytes(t, **frozen)[0])
    comp0 = _per_token(lambda t: compiled_graph_bytes(t, **frozen))
    lines = ["## LoRA: a frozen block and its adapters (bf16, rank 8, no dropout)", "",
             f"- frozen block, eager traced: {eager0:,.0f} bytes a token; by hand (`block_bytes(norm_weight_grads="
             f"False)`): {hand.eager:,}",
             f"- frozen block, compiled (inductor, forward / backward): {comp0[0]:,.0f} / {comp0[1]:,.0f}; by hand "
             f"{hand.compiled_forward:,} / {hand.compiled_backward:,} (+ the 64-byte logsumexp copy in backward)", "",
             "What one adapter adds, bytes a token (measured; by hand: `adapter_time.adapter_bytes_per_token` less "
             "its two skinny GEMMs):", "",
             "| target | eager traced | eager by hand | compiled forward / backward | by hand (COMPILED_ELEMENTWISE) |",
             "|---|---:|---:|---:|---:|"]
    for name in TARGETS:
        block = dict(lora=((name,), 8))
        eager = _per_token(lambda t: eager_bytes(t, **block)[0]) - eager0
        comp = [x - y for x, y in zip(_per_token(lambda t: compiled_graph_bytes(t, **block)), comp0)]
        by_eager, by_comp = _adapters_by_hand(SHAPE, (name,), 8, compiled=False), \
            _adapters_by_hand(SHAPE, (name,), 8, compiled=True)
        lines.append(f"| {name} | {eager:,.0f} | {sum(by_eager):,} | {comp[0]:,.0f} / {comp[1]:,.0f} | "
                     f"{by_comp[0]:,} / {by_comp[1]:,} |")
    wide0 = _per_token(lambda t: compiled_graph_bytes(t, shape=WIDE, lora=((), 16)))
    wide = [x - y for x, y in zip(_per_token(lambda t: compiled_graph_bytes(t, shape=WIDE, lora=(TARGETS, 16))), wide0)]
    by_hand = _adapters_by_hand(WIDE, TARGETS, 16, compiled=True)
    lines += ["", f"Held out: all seven targets at rank 16 on {WIDE}: compiled forward / backward {wide[0]:,.0f} / "
              f"{wide[1]:,.0f} bytes a token; by hand {by_hand[0]:,} / {by_hand[1]:,}.", ""]
    return lines


def main() -> int:
    if "--lora" in sys.argv:
        text = "\n".join(lora_lines()) + "\n"
        print(text)
        path = ROOT / "benchmarks" / "results" / "compile_bytes.md"
        kept = path.read_text().split("## LoRA:")[0].rstrip("\n") + "\n\n"
        path.write_text(kept + text)
        return 0
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
    path = ROOT / "benchmarks" / "results" / "compile_bytes.md"
    lora = path.read_text().partition("## LoRA:")[1:] if path.exists() else ()
    path.write_text(text + ("\n" + "".join(lora) if lora and lora[0] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
