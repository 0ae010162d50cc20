"""``--compile``'s bytes model (advisor.estimate.compile_time): one block by hand, the eager op list against
a trace of transformers' LlamaDecoderLayer, and the seconds it takes off a step."""

from __future__ import annotations

import pytest

from advisor.estimate.compile_time import block_bytes


def test_one_small_block_by_hand():
    """h = 8, f = 16, 2 heads and 1 kv head of 4 (q = 8, kv = 4, hd = 4), bf16 (a = 2; cast = a + 4 = 6).

    Eager forward: RMSNorm cast in 6h 48, pow 8h 64, mean 4h + 4 = 36, + eps 8, rsqrt 8, mul 8h + 4 = 68,
    cast out 48, * weight 2a h 32: 312, two norms 624. RoPE q (w = 8): x * cos 2a w + a hd = 40, -x2 a w 16,
    cat 2a w 32, * sin 40, + 3a w 48: 176; k (w = 4): 24 + 8 + 16 + 24 + 24 = 96. Residual adds 2 x 3a h = 96.
    silu 2a f 64, * up 3a f 96. Total 624 + 176 + 96 + 96 + 160 = 1,152.
    Eager backward: MLP 3 x 3a f = 288; five accumulations 5 x 3a h = 240; a norm: * weight 32, weight-grad
    product 48 and sum 16, two casts 96, products 12h 96 and 8h + 4 = 68, sum 4h + 4 = 36, scalars 28,
    mean's division 4h + 4 = 36, pow's kernels 8h + 8h + 12h = 224, their sum 12h 96: 776, two 1,552;
    RoPE q 11a w + 2a hd = 192, k 88 + 16 = 104; q and k gradient copies 2a (8 + 4) = 48. Total 2,424.
    Compiled forward: norm 2a h + 4 = 36; RoPE q 5a w + 2a hd = 96, k 40 + 16 = 56; residual + norm 3a h + 4
    = 52; silu x up 3a f = 96; last residual 4a h = 64. Total 400.
    Compiled backward: MLP 5a f = 160; second norm with residual 6a h + 4 = 100; weight gradients 7a h + 8
    = 120; first norm 100; RoPE q 2a w + 2a hd = 48, k 32. Total 560."""
    block = block_bytes(hidden=8, intermediate=16, q_width=8, kv_width=4, head_dim=4, activation_bytes=2)
    assert (block.eager_forward, block.eager_backward) == (1152, 2424)
    assert (block.compiled_forward, block.compiled_backward) == (400, 560)
    assert (block.saved_forward, block.saved_backward) == (752, 1864)


def test_eager_op_list_matches_a_trace_of_transformers_llama_block():
    """The eager counts are the bytes every non-matmul, non-attention, non-view aten op of one
    LlamaDecoderLayer (bf16, SDPA) reads and writes, forward and backward (benchmarks/compile_bytes.py)."""
    pytest.importorskip("transformers")
    from benchmarks.compile_bytes import SHAPE, eager_bytes

    small, large = eager_bytes(16)[0], eager_bytes(32)[0]
    hidden, heads, kv_heads = SHAPE["hidden_size"], SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"]
    head_dim = hidden // heads
    block = block_bytes(hidden=hidden, intermediate=SHAPE["intermediate_size"], q_width=hidden,
                        kv_width=kv_heads * head_dim, head_dim=head_dim, activation_bytes=2)
    assert (large - small) / 16 == block.eager == 111_360  # the figure benchmarks/results/compile_bytes.md records


def test_step_time_saving_is_the_bytes_worth():
    """Llama-3.1-8B (h 4096, q 4096, kv 1024, hd 128, f 14336, 32 layers), bf16-mixed, on one H100
    (3,350 GB/s x 0.7), micro-batch 1 x 2048 tokens, no checkpointing. Saved a token and block, by the
    module docstring's a = 2 totals: forward 66h + 10 (q + kv) + 4f + 40 = 270,336 + 51,200 + 57,344 + 40
    = 378,920; backward 176h + 22 (q + kv) + 8f + 64 = 720,896 + 112,640 + 114,688 + 64 = 948,288.
    Seconds: 32 x 2,048 x 1,327,208 / 2.345e12 = 0.037092 s."""
    import advisor
    from advisor.hardware.cluster import parse_gpus

    eager = advisor.plan("meta-llama/Llama-3.1-8B", parse_gpus("1xH100-80GB-SXM"), strategy="zero3",
                         micro_batch_size=1, seq_len=2048, activation_checkpointing="off", optimizer="sgd")
    compiled = advisor.plan("meta-llama/Llama-3.1-8B", parse_gpus("1xH100-80GB-SXM"), strategy="zero3",
                            micro_batch_size=1, seq_len=2048, activation_checkpointing="off", optimizer="sgd",
                            compile=True)
    before, after = eager.candidate("zero3"), compiled.candidate("zero3")
    assert before.step_time.compute_s - after.step_time.compute_s == pytest.approx(32 * 2048 * 1_327_208 / 2.345e12,
                                                                                 rel=1e-9)
    # memory: a bf16 FSDP block without checkpointing saves 8h + 2f = 61,440 bytes a token less compiled
    # (advisor.estimate.compile_memory; benchmarks/results/compile_saved.md measured it on Llama-3.1-8B's block)
    assert (before.memory_bytes.at_end_of_forward - after.memory_bytes.at_end_of_forward) == 32 * 2048 * 61_440
    assert any("advisor.estimate.compile_memory" in note for note in after.step_time.notes)


def test_frozen_norms_match_inductor():
    """A LoRA base freezes the norms: neither mode runs their weight gradients. The benchmark's frozen block
    (benchmarks/compile_bytes.py --lora; h 256, f 704, q 256, kv 64, hd 32, bf16) traced 107,264 bytes a token
    eager (111,360 less 2 x 4a h = 4,096) and inductor counted 12,296 forward and 14,792 backward (the hand count's
    14,728 plus the 64-byte logsumexp copy of the CPU attention kernel: 18,320 less 7a h + 8 = 3,592)."""
    block = block_bytes(hidden=256, intermediate=704, q_width=256, kv_width=64, head_dim=32, activation_bytes=2,
                        norm_weight_grads=False)
    assert block.eager == 107_264
    assert (block.compiled_forward, block.compiled_backward + 64) == (12_296, 14_792)
