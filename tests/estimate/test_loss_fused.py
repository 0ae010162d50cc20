"""--loss fused (``wrappers.losses.fused_linear_cross_entropy``) under autocast over fp32 weights: the kernel
reads the head's weight with autocast off and casts it itself, so autocast caches and saves no copy of the
head (``strategy_buffers._autocast_weight_casts``, ``head_cast``); the kernel's own copy is in
``activations_loss.loss_bytes``. Found by issue 20's sweep (row 7add03ee8ff3, a 128-wide Phi-3 over a
228,608 vocabulary, bf16-mixed: +1.44% at the end of forward, the head's 58.5 MB counted twice)."""

from __future__ import annotations

import warnings

from advisor.estimate.memory import estimate_memory
from advisor.estimate.strategy_buffers import estimate_strategy_buffers
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import spec_from_config
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

WIDE_HEAD = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=176,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=48000,
                 max_position_embeddings=4096, tie_word_embeddings=False, _name_or_path="small-llama-48k")


def test_fused_loss_holds_no_autocast_copy_of_the_head_by_hand():
    """bf16-mixed DDP, no checkpointing: the hf loss's head runs under autocast, whose bf16 copy of the
    48,000 x 64 weight (6,144,000 bytes) is cached to the end of forward and saved for the head's input
    gradient; the fused kernel makes none, so the forward's and the loss backward's buffers are that much smaller.
    In a block's backward neither holds a copy: the hf head's backward, before any block's, freed its own."""
    spec = spec_from_config(WIDE_HEAD, name="small", source="local")
    impl = get_strategy("ddp").on("torch")
    hf, fused = (estimate_strategy_buffers(spec, TrainingConfig(seq_len=256, loss=loss), impl, 2)
                 for loss in ("hf", "fused"))
    assert hf.at_forward_end - fused.at_forward_end == 6_144_000
    assert hf.at_loss - fused.at_loss == 6_144_000
    assert hf.in_backward == fused.in_backward


def test_fused_loss_estimate_matches_the_simulated_step():
    """Peak of the simulated step (fake tensors, ddp x1, micro-batch 4, seq 256, bf16-mixed, SGD; torch 2.13,
    transformers 5.23): 88,714,284 bytes in the loss's forward (one chunk's fp32 and bf16 logits beside the
    kernel's bf16 head copy); the estimate 88,717,056 (+0.003%). Counting autocast's copy of the head as well,
    it was 6,144,000 bytes over (+6.9%)."""
    from advisor.simulate.step import simulate

    spec = spec_from_config(WIDE_HEAD, name="small", source="local")
    training = TrainingConfig(seq_len=256, loss="fused", optimizer="sgd")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = simulate(WIDE_HEAD, world_size=1, strategy="ddp", training=training, micro_batch_size=4,
                            checkpointing=False)
        estimate = estimate_memory(spec, parse_gpus("1xH100"), training, get_strategy("ddp").on("torch"),
                                   micro_batch_size=4, checkpointing=False)
    assert abs(estimate.peak_allocated - measured.peak_allocated) <= 0.005 * measured.peak_allocated


def _kernel_forward_peak(precision: str, *, scratch: bool) -> int:
    """Peak live bytes of the kernel's forward on real CPU tensors (512 tokens, 64 wide, vocabulary 8,000,
    fp32 weight and hidden), op by op as the simulator counts them (``advisor.simulate.measure.LiveBytes``),
    with or without the simulator's stand-in for logsumexp's scratch (``fake_env.kernel_scratch``)."""
    import contextlib

    import torch

    from advisor.simulate.fake_env import kernel_scratch
    from advisor.simulate.measure import LiveBytes
    from wrappers.losses import fused_linear_cross_entropy

    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(8_000, 64) * 0.02)
    hidden, targets = torch.randn(512, 64, requires_grad=True), torch.randint(0, 8_000, (512,))
    live = LiveBytes([weight], None)
    live.track_existing([hidden, targets])
    start = live.peak = live.total
    with kernel_scratch() if scratch else contextlib.nullcontext(), live, \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        fused_linear_cross_entropy(hidden, weight, targets)
    return live.peak - start


def test_fused_kernel_forward_peak_by_hand():
    """512 tokens in 8 chunks of 64, 64 wide, vocabulary 8,000. The input gradient 512 x 64 x 4 = 131,072, the
    fp32 head gradient 8,000 x 64 x 4 = 2,048,000, and at logsumexp a chunk's fp32 logits and its ``self - maxes``
    64 x 8,000 x 8 = 4,096,000; bf16-mixed adds the bf16 head copy 1,024,000 and the chunk's bf16 input 64 x 64 x 2
    = 8,192: 7,307,264; fp32 6,275,072 (grad @ w's rows, 64 x 64 x 4, come after the scratch is freed). The
    kernel on real tensors, op by op with the simulator's scratch, is a few bytes a row over (per-row vectors:
    the log-sum-exp, the maxes, the mask, the targets). Without the scratch the dispatch mode sees only the op's
    output (next test), and the peak is the softmax's product with the head: the chunk's fp32 logits, their bf16
    copy and the product's 64 x 64 x 2 rows, 6,291,456 in bf16-mixed; in fp32 the logits and the rows,
    4,243,456."""
    from advisor.estimate.activations import Dtypes
    from advisor.estimate.activations_loss import loss_bytes

    mixed = Dtypes(residual=4, compute=2, input_casts=True)
    fp32 = Dtypes(residual=4, compute=4, input_casts=False)
    expected = {"bf16-mixed": loss_bytes("fused", tokens=512, vocab=8_000, hidden=64, dt=mixed)[0],
                "fp32": loss_bytes("fused", tokens=512, vocab=8_000, hidden=64, dt=fp32)[0]}
    assert expected == {"bf16-mixed": 7_307_264, "fp32": 6_275_072}
    for precision, peak in expected.items():
        assert 0 <= _kernel_forward_peak(precision, scratch=True) - peak <= 64 * 24
    unseen = {"bf16-mixed": 6_291_456, "fp32": 4_243_456}
    for precision, peak in unseen.items():
        assert 0 <= _kernel_forward_peak(precision, scratch=False) - peak <= 64 * 16


def test_logsumexp_allocates_a_temporary_as_large_as_its_input():
    """Why fp32 counts a second chunk-sized tensor the simulator does not show: logsumexp is one aten op whose
    kernel (ReduceOps.cpp ``logsumexp_out_impl``, CompositeExplicitAutograd, so CUDA runs it too) allocates
    ``self - maxes``. Measured with the profiler on real CPU tensors: 64 x 8,000 x 4 = 2,048,000 bytes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    logits = torch.randn(64, 8_000)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.logsumexp(logits, dim=-1)
    sub = [e for e in prof.key_averages() if e.key == "aten::sub"]
    assert [e.self_cpu_memory_usage for e in sub] == [2_048_000]
