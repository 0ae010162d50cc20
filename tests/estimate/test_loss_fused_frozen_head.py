"""--loss fused over a frozen head (LoRA on the blocks, the usual case): the kernel makes no head-gradient
accumulator (``ctx.needs_input_grad``) and, over LoRA's bf16 base, no bf16 copy of the head (``weight.to`` returns
the bf16 weight); ``activations_loss.loss_bytes(head_frozen=True)`` counts neither. Before, the kernel built an
fp32 ``vocab x hidden`` gradient nobody read (2,179,989,504 bytes on Qwen2.5-7B) and the estimate counted it and a
head copy that does not exist (1,089,994,752 bytes there)."""

from __future__ import annotations

import warnings

import pytest

from advisor.estimate.activations import Dtypes
from advisor.estimate.activations_loss import loss_bytes, loss_kept_bytes

LORA_BF16 = Dtypes(residual=2, compute=2, input_casts=True)  # recipe_dtypes: autocast over LoRA's bf16 base
MIXED = Dtypes(residual=4, compute=2, input_casts=True)  # autocast over fp32 weights


def _kernel_forward_peak(weight_dtype, hidden_dtype) -> int:
    """Peak live bytes of the kernel's forward over a frozen head on real CPU tensors under bf16 autocast (512
    tokens, 64 wide, vocabulary 8,000), op by op as the simulator counts them (``LiveBytes``)."""
    import torch

    from advisor.simulate.fake_env import kernel_scratch
    from advisor.simulate.measure import LiveBytes
    from wrappers.losses import fused_linear_cross_entropy

    torch.manual_seed(0)
    weight = torch.nn.Parameter((torch.randn(8_000, 64) * 0.02).to(weight_dtype), requires_grad=False)
    hidden = torch.randn(512, 64, dtype=hidden_dtype, requires_grad=True)
    targets = torch.randint(0, 8_000, (512,))
    live = LiveBytes([weight], None)
    live.track_existing([hidden, targets])
    start = live.peak = live.total
    with kernel_scratch(), live, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(hidden, weight, targets)
    loss.backward()
    assert weight.grad is None and hidden.grad is not None
    return live.peak - start


@pytest.mark.parametrize("base", ["bf16", "fp32"])
def test_frozen_head_forward_peak_by_hand(base):
    """bf16 base (LoRA's): the input gradient 512 x 64 x 2 = 65,536 and, at logsumexp, a chunk's fp32 logits and its
    ``self - maxes`` 64 x 8,000 x 8 = 4,096,000: 4,161,536 (the old kernel added the fp32 gradient, 8,000 x 64 x 4
    = 2,048,000). fp32 base under autocast: the input gradient 131,072, the bf16 head copy 1,024,000, the chunk's
    two fp32 tensors 4,096,000 and its bf16 input 64 x 64 x 2 = 8,192: 5,259,264. The kernel on real tensors, with
    the simulator's stand-in for logsumexp's scratch (``fake_env.kernel_scratch``), is a few bytes a row over
    (per-row vectors)."""
    import torch

    dt, hand = (LORA_BF16, 4_161_536) if base == "bf16" else (MIXED, 5_259_264)
    assert loss_bytes("fused", tokens=512, vocab=8_000, hidden=64, dt=dt, head_frozen=True)[0] == hand
    dtype = torch.bfloat16 if base == "bf16" else torch.float32
    assert 0 <= _kernel_forward_peak(dtype, dtype) - hand <= 64 * 24


def test_qwen_7b_lora_loss_path_by_hand():
    """Qwen2.5-7B (hidden 3,584, vocabulary 152,064), 2,048 tokens, LoRA's bf16 base: the input gradient
    2,048 x 3,584 x 2 = 14,680,064 and a chunk's fp32 logits with logsumexp's scratch 256 x 152,064 x 8 =
    311,427,072: 326,107,136 at the end of forward (250,085,376 before the scratch was counted, with the chunk's
    bf16 copy and rows instead; 3,520,069,632 before that, with the fp32 gradient 2,179,989,504 and a bf16 head
    copy 1,089,994,752); the input gradient and its scaled copy in backward, and the input gradient kept."""
    args = dict(tokens=2_048, vocab=152_064, hidden=3_584, dt=LORA_BF16)
    assert loss_bytes("fused", **args, head_frozen=True) == (326_107_136, 29_360_128)
    assert loss_kept_bytes("fused", **args, head_frozen=True) == 14_680_064


WIDE_HEAD = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=176,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=48000,
                 max_position_embeddings=4096, tie_word_embeddings=False, _name_or_path="small-llama-48k")


def test_lora_fused_estimate_matches_the_simulated_step():
    """LoRA r 8 over a 64-wide Llama with a 48,000 vocabulary, ddp x1, micro-batch 4, seq 256, bf16-mixed, SGD
    (torch 2.13, transformers 5.23, PEFT 0.21): simulated 66,589,100 bytes at the loss's forward, the estimate
    66,422,400 (-0.25%); 54,316,460 and 54,249,088 before the simulator allocated logsumexp's scratch, one chunk's
    fp32 logits (``fake_env.kernel_scratch``). Before the frozen head: simulated 66,604,460 (the kernel's fp32
    head gradient, 12,288,000 more) and estimated 72,681,088 (+9.1%: that gradient and a bf16 copy of the bf16
    head, 6,144,000)."""
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.lora import LoraConfig, with_lora
    from advisor.model.sources import spec_from_config
    from advisor.simulate.step import simulate
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    training = TrainingConfig(seq_len=256, loss="fused", optimizer="sgd", lora=LoraConfig(rank=8))
    spec = with_lora(spec_from_config(WIDE_HEAD, name="small", source="local"), training.lora)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = simulate(WIDE_HEAD, world_size=1, strategy="ddp", training=training, micro_batch_size=4,
                            checkpointing=False)
    estimate = estimate_memory(spec, parse_gpus("1xH100"), training, get_strategy("ddp").on("torch"),
                               micro_batch_size=4, checkpointing=False)
    assert measured.peak_allocated == 66_589_100
    assert abs(estimate.peak_allocated - measured.peak_allocated) <= 0.005 * measured.peak_allocated
