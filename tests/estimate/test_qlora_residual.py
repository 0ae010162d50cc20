"""The fact behind ``Recipe.kbit_upcast``: under bf16 autocast a QLoRA Llama's residual stream is fp32 where the
norms were upcast to fp32 (PEFT's prepare_model_for_kbit_training, TRL's path) and bf16 where the base stays as
loaded (LLaMA-Factory v0.6.2). Measured on real CPU tensors: a tiny transformers Llama whose block linears are
replaced by a stand-in with bitsandbytes' ``Linear4bit`` dtype behaviour (bitsandbytes/nn/modules.py
``Linear4bit.forward``: the input cast to the compute dtype, the product cast back to the input's dtype; the
weights are not quantised, which changes no dtype) under PEFT's 4-bit LoRA forward
(``benchmarks/qlora_layer_bytes.py``), bf16 embeddings (TRL casts them back to bf16 for a 4-bit
model), each decoder layer's input dtype read by a forward pre-hook."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _benchmark():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import qlora_layer_bytes

    return qlora_layer_bytes


def _layer_input_dtypes(norm_dtype) -> list:
    """benchmarks/qlora_layer_bytes.py's model (3 blocks, each linear a 4-bit stand-in under PEFT's LoRA forward)."""
    bench = _benchmark()
    model = bench.qlora_model(norm_dtype)
    seen = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).dtype),
            with_kwargs=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.randint(0, bench.CONFIG["vocab_size"], (1, 16)))
    return seen


def test_fp32_norms_make_the_residual_fp32_after_the_first_block():
    """The TRL path (kbit_upcast true): the first block reads the bf16 embedding, every later block an fp32 residual
    (the fp32 norm's output feeds the MLP's linears, which return fp32, and the residual sum promotes). The estimate
    counts every block's saved input in fp32: one block's bf16 input over."""
    assert _layer_input_dtypes(torch.float32) == [torch.bfloat16, torch.float32, torch.float32]


def test_bf16_norms_keep_the_residual_bf16():
    """LLaMA-Factory's path (kbit_upcast false): nothing is upcast, every block reads bf16."""
    assert _layer_input_dtypes(torch.bfloat16) == [torch.bfloat16] * 3


def test_a_qlora_layers_saved_bytes_match_the_estimate_on_both_paths():
    """``benchmarks/qlora_layer_bytes.py``: a 256-wide Llama's layers under bf16 autocast with Linear4bit's dtype rule
    and PEFT's 4-bit LoRA forward, saved bytes counted by storage (parameters left out), against the estimate's layer
    (no checkpointing). fp32 norms: the gate, up and activation outputs are fp32 (``Dtypes.mlp``), +1.3% (the o_proj
    adapter's input cast the estimate counts, which a bf16 SDPA output does not need, less the adapters' weight casts
    it leaves out); before they were counted in bf16, -24%. bf16 norms: -2.8% (the adapters' fp32 weights cast to bf16
    under autocast, rank-sized, not counted). Layers after the first: the first reads the bf16 embedding."""
    for label, measured, estimate in _benchmark().rows():
        later = sum(measured[1:]) / len(measured[1:])
        assert abs(estimate / later - 1) <= 0.03, (label, measured, estimate)
