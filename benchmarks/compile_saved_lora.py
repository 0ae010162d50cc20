"""What a LoRA Llama block saves for backward, eager and compiled (real CPU tensors): the frozen base in bf16, PEFT's
adapters in fp32, under bf16 autocast (the torch recipe's LoRA under DDP, profiles/recipes.json frozen_base).

    PYTHONPATH=$PWD python benchmarks/compile_saved_lora.py [--hidden 256 --intermediate 704 --seq 128 --targets q_proj,v_proj]

A transformers ``LlamaDecoderLayer`` (SDPA), PEFT LoRA (rank 16, dropout 0) on ``--targets``, its frozen weights cast
to bf16, called under ``torch.autocast("cpu", bfloat16)`` with CUDA's fp32 op list (``advisor.simulate.autocast``).
Eager: the distinct storages ``saved_tensors_hooks`` sees, the parameters, the autocast casts of the weights and the
shared cos/sin left out. Compiled: ``torch.compile`` with an ``aot_autograd`` backend on inductor's decompositions
and ``partition_fn`` whose compilers return the graphs; saved = the forward graph's outputs beyond the user's
output with a token dimension (cos/sin left out). Small real tensors: a few seconds. Prints both lists and
eager - compiled, the bytes a token a block that compile does not keep.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.saved_tensors import add_block_shape_arguments, inductor_saved  # noqa: E402


def lora_block(*, hidden: int, intermediate: int, heads: int, kv_heads: int, targets: tuple[str, ...], rank: int,
               bf16_adapters: bool = False):
    import peft
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, 0)
    layer = peft.inject_adapter_in_model(peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                         target_modules=list(targets)), layer)
    for name, param in layer.named_parameters():
        if "lora_" not in name:
            param.requires_grad_(False)
        if "lora_" not in name or bf16_adapters:
            param.data = param.data.to(torch.bfloat16)
    return layer.train()


def _rows(tensors, seq: int, skip: set) -> list[tuple[str, tuple, torch.dtype, int]]:
    from torch.multiprocessing.reductions import StorageWeakRef

    seen, rows = set(skip), []
    for name, t in tensors:
        key = StorageWeakRef(t.untyped_storage())
        if key in seen or seq not in t.shape:
            continue
        seen.add(key)
        rows.append((name, tuple(t.shape), t.dtype, t.untyped_storage().nbytes()))
    return rows


def saved(layer, *, hidden: int, heads: int, seq: int, compiled: bool, autocast: bool = True):
    from torch.multiprocessing.reductions import StorageWeakRef

    from advisor.simulate.autocast import cuda_fp32_policy

    head_dim = hidden // heads
    cos, sin = (torch.randn(1, seq, head_dim, dtype=torch.bfloat16) for _ in range(2))
    x = torch.randn(1, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    skip = {StorageWeakRef(t.untyped_storage()) for t in (*layer.parameters(), cos, sin)}

    def block(y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return layer(y, position_embeddings=(cos, sin))

    with cuda_fp32_policy():
        if not compiled:
            packed = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
                out = block(x)
            rows = _rows([("eager", t) for t in packed], seq, skip)
            out.sum().backward()
            return rows
        tensors = inductor_saved(block, x, skip_shapes={tuple(cos.shape)})
    return _rows(tensors, seq, set())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_block_shape_arguments(parser)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default="q_proj,v_proj")
    parser.add_argument("--bf16", action="store_true",
                        help="adapters in bf16 too and no autocast (FSDP2's MixedPrecisionPolicy gathers them in bf16)")
    args = parser.parse_args(argv)
    targets = tuple(args.targets.split(","))
    print(f"LlamaDecoderLayer h {args.hidden}, f {args.intermediate}, {args.heads} / {args.kv_heads} heads, SDPA, "
          f"s {args.seq}; frozen bf16 base, LoRA r{args.rank} on {', '.join(targets)}, "
          f"{'bf16 adapters, no autocast' if args.bf16 else 'fp32 adapters, bf16 autocast'} (torch {torch.__version__})\n")
    totals = {}
    for compiled in (False, True):
        layer = lora_block(hidden=args.hidden, intermediate=args.intermediate, heads=args.heads,
                           kv_heads=args.kv_heads, targets=targets, rank=args.rank, bf16_adapters=args.bf16)
        rows = saved(layer, hidden=args.hidden, heads=args.heads, seq=args.seq, compiled=compiled,
                     autocast=not args.bf16)
        totals[compiled] = sum(r[3] for r in rows)
        print(f"{'compiled' if compiled else 'eager'}: {totals[compiled] / args.seq:,.0f} bytes a token")
        for op, shape, dtype, nbytes in rows:
            print(f"    {op:<44} {str(list(shape)):<20} {str(dtype).replace('torch.', ''):<9} {nbytes / args.seq:>8,.0f}")
        print()
    print(f"eager - compiled: {(totals[False] - totals[True]) / args.seq:,.0f} bytes a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
