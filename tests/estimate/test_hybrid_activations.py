"""Jamba activations: the per-layer count (``advisor.estimate.activations_hybrid`` composed with the
decoder's attention and MoE pieces) against what autograd saves in each block of a real tiny
JambaForCausalLM on the CPU (transformers' reference scan), one block of each of the four kinds."""

from __future__ import annotations

import pytest
import torch
import transformers

from advisor.estimate.activations import Dtypes, estimate_activations, shape_of
from advisor.estimate.activations_hybrid import hybrid_layers_per_token
from advisor.model.sources import spec_from_config

BATCH, SEQ = 2, 16
# Attention at 1 and 3, experts at 0 and 3: Mamba+MoE, attention+MLP, Mamba+MLP, attention+MoE.
CFG = dict(model_type="jamba", architectures=["JambaForCausalLM"], hidden_size=64, intermediate_size=96,
           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=100, num_experts=4,
           num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=3,
           expert_layer_offset=0, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
           use_mamba_kernels=False)


def _saved_per_block(cfg: dict, dtype: torch.dtype) -> list[int]:
    """Bytes of new (non-weight) storage autograd saves while each block runs forward."""
    torch.manual_seed(0)
    config = transformers.JambaConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    config._attn_implementation = "sdpa"
    model = transformers.JambaForCausalLM(config).to(dtype).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    current, seen = [None], {}
    per_block = [0] * len(model.model.layers)
    for i, block in enumerate(model.model.layers):
        block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i))
        block.register_forward_hook(lambda m, a, o: current.__setitem__(0, None))

    def pack(tensor):
        ptr = tensor.untyped_storage().data_ptr()
        if current[0] is not None and ptr not in weights and ptr not in seen:
            seen[ptr] = True
            per_block[current[0]] += tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)))
    return per_block


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_jamba_block_matches_what_autograd_saves(dtype):
    """The count leaves out each block RMSNorm's rsqrt (4 bytes a token a norm, as the decoder count
    does) and, in Mamba blocks, the per-layer constants (exp(A_log) twice and D: 256-272 bytes a token
    here): within 2% of every block, never above it. fp32 runs without GQA: with it the count assumes
    CUDA's math SDPA, which the CPU does not run (``activations_blocks.cuda_math_sdpa``)."""
    cfg = CFG if dtype == torch.bfloat16 else {**CFG, "num_key_value_heads": 4}
    spec = spec_from_config(cfg, name="jamba", source="local")
    cb = 2 if dtype == torch.bfloat16 else 4
    dtypes = Dtypes(residual=cb, compute=cb, input_casts=False)
    shape = shape_of(spec)
    assert shape.hybrid is not None and shape.note and "Jamba" in shape.note
    per_layer = hybrid_layers_per_token(shape, dtypes, seq_len=SEQ, eager=False)
    measured = _saved_per_block(cfg, dtype)
    for i, (est, got) in enumerate(zip(per_layer, measured)):
        est *= BATCH * SEQ
        assert 0.98 * got <= est <= got, (i, est, got)
    total = estimate_activations(shape, dtypes, micro_batch_size=BATCH, seq_len=SEQ, checkpointing=False, eager=False)
    assert total.layer_bytes == max(per_layer) * BATCH * SEQ
