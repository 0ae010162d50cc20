"""Bytes a Llama decoder block saves for backward, eager and compiled (AOTAutograd's min-cut partitioner), on fake tensors.

    PYTHONPATH=$PWD python benchmarks/compile_saved.py --seq 8192 --batch 2      # Llama-3.1-8B's block
    PYTHONPATH=$PWD python benchmarks/compile_saved.py --small --seq 256 --batch 1

One transformers ``LlamaDecoderLayer`` (5.23, SDPA), bf16 weights and no autocast (torchtitan's FSDP2
MixedPrecisionPolicy: the block computes in bf16), its parameters and inputs fake tensors
(``FakeTensorMode``: no storage, no kernel; the real 8B shape costs nothing). The rotary cos/sin are passed
in as ``position_embeddings`` (shared by every block; the estimate counts them once outside the blocks:
``rope_tables_per_token``), so they are left out of both counts below.

- eager (tests/saved_tensors.py eager_saved): the forward under ``torch.autograd.graph.saved_tensors_hooks``, distinct storages alive once it
  has returned, parameters excluded (``tests/saved_tensors.py``'s rule, with storages told apart by
  ``StorageWeakRef`` since fake tensors have no address); each tensor named by the op that made it (a
  ``TorchDispatchMode`` under the fake mode records which op wrote each storage);
- compiled (compiled_saved): the same forward and backward through ``aot_function`` with inductor's decompositions
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
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.saved_tensors import compiled_saved, eager_saved  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
SMALL = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2)


def estimate_per_token(shape: dict, *, seq: int, autocast: bool = False) -> int:
    """The estimate's own per-layer count for this block (eager, SDPA), bytes a token."""
    from advisor.estimate.activations import ActivationShape, Dtypes
    from advisor.estimate.activations_blocks import decoder_layer_per_token

    h, heads = shape["hidden_size"], shape["num_attention_heads"]
    act = ActivationShape(num_layers=1, hidden_size=h, num_attention_heads=heads,
                          num_kv_heads=shape["num_key_value_heads"], head_dim=h // heads,
                          intermediate_size=shape["intermediate_size"], vocab_size=128, family="decoder")
    return decoder_layer_per_token(act, Dtypes(residual=4 if autocast else 2, compute=2, input_casts=autocast), seq_len=seq, eager=False)


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
    parser.add_argument("--autocast", action="store_true", help="fp32 weights under bf16 autocast (CUDA's fp32 list)")
    args = parser.parse_args(argv)
    shape = SMALL if args.small else LLAMA_8B
    tokens = args.batch * args.seq
    eager = eager_saved(shape, batch=args.batch, seq=args.seq, autocast=args.autocast)
    compiled = compiled_saved(shape, batch=args.batch, seq=args.seq, autocast=args.autocast)
    print(f"LlamaDecoderLayer {shape}, {'fp32 weights under bf16 autocast' if args.autocast else 'bf16'}, SDPA, batch {args.batch}, seq {args.seq} (torch {torch.__version__})\n")
    print("\n".join(_table("eager (saved_tensors_hooks)", eager, tokens)))
    print("\n".join(_table("compiled (inductor's partition_fn, min-cut)", compiled, tokens)))
    e, c = sum(r[3] for r in eager), sum(r[3] for r in compiled)
    print(f"eager - compiled: {(e - c) / tokens:,.0f} bytes a token ({(e - c) / e:.1%} of eager)")
    print(f"the estimate's eager count (activations_blocks.decoder_layer_per_token, which leaves out the two rsqrt "
          f"outputs, 8 bytes): {estimate_per_token(shape, seq=args.seq, autocast=args.autocast):,} bytes a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
