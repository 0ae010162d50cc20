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
    gradient; the fused kernel makes none, so every moment's buffers are that much smaller."""
    spec = spec_from_config(WIDE_HEAD, name="small", source="local")
    impl = get_strategy("ddp").on("torch")
    hf, fused = (estimate_strategy_buffers(spec, TrainingConfig(seq_len=256, loss=loss), impl, 2)
                 for loss in ("hf", "fused"))
    assert hf.at_forward_end - fused.at_forward_end == 6_144_000
    assert hf.at_loss - fused.at_loss == 6_144_000
    assert hf.in_backward - fused.in_backward == 6_144_000


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
