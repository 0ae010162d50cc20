"""Bytes a Llama decoder block saves for backward, eager and compiled (AOTAutograd's min-cut partitioner), on fake tensors.

    PYTHONPATH=$PWD python benchmarks/compile_saved.py --seq 8192 --batch 2      # Llama-3.1-8B's block
    PYTHONPATH=$PWD python benchmarks/compile_saved.py --small --seq 256 --batch 1

One transformers ``LlamaDecoderLayer`` (5.23, SDPA), bf16 weights and no autocast (torchtitan's FSDP2
MixedPrecisionPolicy: the block computes in bf16), its parameters and inputs fake tensors
(``FakeTensorMode``: no storage, no kernel; the real 8B shape costs nothing). The rotary cos/sin are passed
in as ``position_embeddings`` (shared by every block; the estimate counts them once outside the blocks:
``rope_tables_per_token``), so they are left out of both counts below.

- eager: the forward under ``torch.autograd.graph.saved_tensors_hooks``, distinct storages alive once it
  has returned, parameters excluded (``tests/saved_tensors.py``'s rule, with storages told apart by
  ``StorageWeakRef`` since fake tensors have no address); each tensor named by the op that made it (a
  ``TorchDispatchMode`` under the fake mode records which op wrote each storage);
- compiled: the same forward and backward through ``aot_function`` with inductor's decompositions
  (``torch._inductor.decomposition.select_decomp_table``) and inductor's partition function
  (``torch._inductor.compile_fx.partition_fn``: its joint-graph passes, then
  ``min_cut_rematerialization_partition(compiler="inductor")``), the compilers returning the graphs unchanged.
  The saved tensors are the forward graph's outputs beyond the user's output (the backward graph's
  inputs other than its tangents), with their shapes and dtypes from the FX node meta ``val``; distinct
  storages, parameters (and their transposed views) and the cos/sin excluded.

Prints both lists and the totals per token of one layer.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
SMALL = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2)


def _key(t: torch.Tensor):
    return StorageWeakRef(t.untyped_storage())


class _Writers(TorchDispatchMode):
    """Which op wrote each storage (the last op to return it)."""

    def __init__(self):
        super().__init__()
        self.op = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and _key(t) not in self.op:
                self.op[_key(t)] = func.__name__
        return out


def build(shape: dict, *, batch: int, seq: int):
    """(layer on the meta device, fake params, fake x, fake cos, fake sin, the fake mode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(**shape, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        layer = LlamaDecoderLayer(config, 0).to(torch.bfloat16).train()
    mode = FakeTensorMode()
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    with mode:
        params = {n: torch.empty(p.shape, dtype=p.dtype).requires_grad_() for n, p in layer.named_parameters()}
        x = torch.empty(batch, seq, shape["hidden_size"], dtype=torch.bfloat16).requires_grad_()
        cos = torch.empty(1, seq, head_dim, dtype=torch.bfloat16)
        sin = torch.empty(1, seq, head_dim, dtype=torch.bfloat16)
    return layer, params, x, cos, sin, mode


def _call(layer, params, x, cos, sin):
    return torch.func.functional_call(layer, params, (x,), {"position_embeddings": (cos, sin)})


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def eager_saved(shape: dict, *, batch: int, seq: int) -> list[tuple[str, tuple, torch.dtype, int]]:
    """(op, shape, dtype, bytes) of each distinct storage the eager forward leaves saved."""
    layer, params, x, cos, sin, mode = build(shape, batch=batch, seq=seq)
    skip = {_key(t) for t in (*params.values(), cos, sin)}
    packed = []
    with mode:
        writers = _Writers()
        with writers, torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
            out = _call(layer, params, x, cos, sin)
        seen, rows = set(), []
        for t in packed:
            k = _key(t)
            if k in skip or k in seen:
                continue
            seen.add(k)
            rows.append((writers.op.get(k, "input"), tuple(t.shape), t.dtype, _nbytes(t)))
        del out
    return rows


def compiled_saved(shape: dict, *, batch: int, seq: int) -> list[tuple[str, tuple, torch.dtype, int]]:
    """(op, shape, dtype, bytes) of each distinct storage the partitioned forward graph saves for backward."""
    from functorch.compile import aot_function, make_boxed_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    layer, params, x, cos, sin, mode = build(shape, batch=batch, seq=seq)
    graphs = {}

    def keep(name):
        def compiler(gm, _inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    with mode:
        fn = aot_function(lambda p, x, c, s: _call(layer, p, x, c, s), fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                          partition_fn=partition_fn, decompositions=select_decomp_table())
        out = fn(params, x, cos, sin)
        out.sum().backward()
    fw_nodes = list(graphs["fw"].graph.nodes)
    placeholders = [n for n in fw_nodes if n.op == "placeholder"]
    num_params = len(params)
    # aot_function flattens (params, x, cos, sin): the params first, then x, cos, sin
    skip = {_key(n.meta["val"]) for n in placeholders[:num_params]}
    skip |= {_key(n.meta["val"]) for n in placeholders[num_params + 1:]}
    tangents = sum(1 for n in graphs["bw"].graph.nodes if n.op == "placeholder" and n.name.startswith("tangents"))
    outputs = fw_nodes[-1].args[0]
    seen, rows = set(), []
    for node in outputs[tangents:]:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        k = _key(val)
        if k in skip or k in seen:
            continue
        seen.add(k)
        op = "input x" if node.op == "placeholder" else str(node.target).replace("aten.", "")
        rows.append((f"{op} ({node.name})", tuple(val.shape), val.dtype, _nbytes(val)))
    return rows


def estimate_per_token(shape: dict, *, seq: int) -> int:
    """The estimate's own per-layer count for this block (eager, SDPA), bytes a token."""
    from advisor.estimate.activations import ActivationShape, Dtypes
    from advisor.estimate.activations_blocks import decoder_layer_per_token

    h, heads = shape["hidden_size"], shape["num_attention_heads"]
    act = ActivationShape(num_layers=1, hidden_size=h, num_attention_heads=heads,
                          num_kv_heads=shape["num_key_value_heads"], head_dim=h // heads,
                          intermediate_size=shape["intermediate_size"], vocab_size=128, family="decoder")
    return decoder_layer_per_token(act, Dtypes(residual=2, compute=2, input_casts=False), seq_len=seq, eager=False)


def _table(title: str, rows, tokens: int) -> list[str]:
    lines = [f"{title}: {sum(r[3] for r in rows) / tokens:,.0f} bytes a token", ""]
    lines += [f"    {op:<40} {str(list(s)):<22} {str(dt).replace('torch.', ''):<9} {b / tokens:>10,.0f}"
              for op, s, dt, b in rows]
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="a 256-wide block (8 heads, 2 kv heads, 704 MLP)")
    args = parser.parse_args(argv)
    shape = SMALL if args.small else LLAMA_8B
    tokens = args.batch * args.seq
    eager = eager_saved(shape, batch=args.batch, seq=args.seq)
    compiled = compiled_saved(shape, batch=args.batch, seq=args.seq)
    print(f"LlamaDecoderLayer {shape}, bf16, SDPA, batch {args.batch}, seq {args.seq} (torch {torch.__version__})\n")
    print("\n".join(_table("eager (saved_tensors_hooks)", eager, tokens)))
    print("\n".join(_table("compiled (inductor's partition_fn, min-cut)", compiled, tokens)))
    e, c = sum(r[3] for r in eager), sum(r[3] for r in compiled)
    print(f"eager - compiled: {(e - c) / tokens:,.0f} bytes a token ({(e - c) / e:.1%} of eager)")
    print(f"the estimate's eager count (activations_blocks.decoder_layer_per_token, bf16, no input casts, which leaves "
          f"out the two rsqrt outputs, 8 bytes): {estimate_per_token(shape, seq=args.seq):,} bytes a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
