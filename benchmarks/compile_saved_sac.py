"""What a compiled Llama block saves for backward under torchtitan's selective op checkpointing (real CPU tensors).

    PYTHONPATH=$PWD python benchmarks/compile_saved_sac.py [--hidden 256 --intermediate 704 --seq 128]

A bf16 transformers ``LlamaDecoderLayer`` (SDPA) inside ``torch.utils.checkpoint`` (non-reentrant) with torchtitan's
op-level policy (9dec370 ``torchtitan/parallelisms/parallelize_llama.py`` ``_custom_policy``: save the outputs of
``mm`` and the attention kernel, except every second ``mm``; the CPU flash kernel stands in for CUDA's), through
``torch.compile`` with an ``aot_autograd`` backend built on inductor's decompositions and ``partition_fn`` whose
compilers return the graphs. Saved = the forward graph's outputs beyond the user's output; the rotary cos/sin
(shared by every block) and the parameters left out. Small real tensors (dynamo does not take fake inputs here):
a few seconds. Prints each saved tensor and the bytes a token.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.saved_tensors import add_block_shape_arguments, inductor_saved  # noqa: E402


def compiled_sac_saved(*, hidden: int, intermediate: int, heads: int, kv_heads: int, seq: int):
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, 0).to(torch.bfloat16).train()
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    def context():
        count = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):  # torchtitan's _custom_policy
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                count[mode] += 1
            keep = func in save and not (func == torch.ops.aten.mm.default and count[mode] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)

    head_dim = hidden // heads
    cos, sin = (torch.randn(1, seq, head_dim, dtype=torch.bfloat16) for _ in range(2))

    def block(x):
        return checkpoint(lambda y: layer(y, position_embeddings=(cos, sin)), x, use_reentrant=False,
                          context_fn=context)

    x = torch.randn(1, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    # parameters (no token dimension) and the shared cos/sin left out
    return [(label, tuple(val.shape), val.dtype, val.numel() * val.element_size())
            for label, val in inductor_saved(block, x, skip_shapes={tuple(cos.shape)}, input_label="input x")
            if seq in val.shape]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_block_shape_arguments(parser)
    args = parser.parse_args(argv)
    rows = compiled_sac_saved(hidden=args.hidden, intermediate=args.intermediate, heads=args.heads,
                              kv_heads=args.kv_heads, seq=args.seq)
    print(f"LlamaDecoderLayer h {args.hidden}, f {args.intermediate}, {args.heads} / {args.kv_heads} heads, bf16, SDPA, "
          f"s {args.seq}, torchtitan's selective op checkpointing, compiled (torch {torch.__version__})\n")
    for op, shape, dtype, nbytes in rows:
        print(f"    {op:<44} {str(list(shape)):<20} {str(dtype).replace('torch.', ''):<9} {nbytes / args.seq:>8,.0f}")
    print(f"\nsaved: {sum(r[3] for r in rows) / args.seq:,.0f} bytes a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
