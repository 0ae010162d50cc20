"""LoRA on a frozen T5 / BART (``advisor.estimate.activations_encdec``, frozen-base section): a block's count
worked by hand, and the plan's peak against the fake-tensor simulator's step (PEFT's adapters on the meta model,
DDP on 2 GPUs, bf16 base under autocast with fp32 adapters, no checkpointing). Before the frozen-base count the
estimate was the full fine-tune's: +23.9% (T5 q,v), +8.8% (T5 all-linear), +8.7% (BART q,v), -8.5% (BART
all-linear) at 128 wide, s 128."""

from __future__ import annotations

import warnings

import pytest

from advisor.estimate.activations import Adapters, Dtypes, shape_of
from advisor.estimate.activations_encdec_frozen import frozen_encdec_parts
from advisor.model.lora import LoraConfig, adapter_inputs, with_lora
from advisor.model.sources import spec_from_config

T5 = dict(model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=256, d_model=64, d_kv=16,
          num_heads=4, d_ff=160, num_layers=2, num_decoder_layers=2, dropout_rate=0.1, decoder_start_token_id=0,
          pad_token_id=0, eos_token_id=1, _name_or_path="tiny/t5-lora")
BART = dict(model_type="bart", architectures=["BartForConditionalGeneration"], vocab_size=256, d_model=64,
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=160, decoder_ffn_dim=160, max_position_embeddings=1024, dropout=0.1,
            attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            decoder_start_token_id=2, _name_or_path="tiny/bart-lora")
AUTOCAST_BF16_BASE = Dtypes(residual=2, compute=2, input_casts=True)


def test_t5_encoder_block_worked_by_hand():
    """A 128-wide T5 encoder block (4 heads of 32, d_ff 320), eager, s 64, bf16 base under autocast, LoRA r8 on
    q and v. Per token: two frozen T5LayerNorms, each the fp32 copy of its input 4 x 128 and the bf16 input
    2 x 128: 2 x 768 = 1536. Attention: q, k, v 3 x 2 x 128 = 768; fp32 softmax 4 x 4 x 64 = 1024, its dropout
    mask 4 x 64 = 256 and the dropped bf16 probabilities 2 x 4 x 64 = 512; o saves nothing (frozen); the output
    dropout's mask 128: 2688. Feed-forward: relu's output 2 x 320 = 640, its dropout mask 320, the output
    mask 128: 1088. Adapters: each lora_A its own bf16 cast of the norm output 2 x 128, lora_B x A 2 x 8:
    2 x 272 = 544. 5856 a token (the rsqrt, 4 bytes a norm, left out as in the full count), plus autocast's bf16
    copies of A and B, 2 x 2 x 8 x (128 + 128) = 8192 a block. Checked against saved_tensors_hooks on the real
    model under PEFT 0.21 (CPU autocast keeps the softmax in bf16: 512 less; the rsqrt 8 more)."""
    config = {**T5, "d_model": 128, "d_kv": 32, "d_ff": 320}
    spec = spec_from_config(config, name="t5-128", source="local")
    adapters = Adapters(rank=8, dropout=False, inputs=adapter_inputs(spec, LoraConfig(rank=8, targets=("q", "v"))))
    enc, _, _ = frozen_encdec_parts(shape_of(spec), AUTOCAST_BF16_BASE, adapters, micro_batch_size=1, src_len=64,
                                    tgt_len=64, eager=True, checkpointing=False)
    assert enc == 64 * 5856 + 8192


def test_gated_t5_adapters_and_dora_not_modelled():
    """Gated T5's wi_0 and wi_1 adapters read the feed-forward norm's output (tests/estimate/test_encdec_lora_ckpt.py
    checks the count); DoRA has no frozen-base count (the planner refuses it)."""
    gated = spec_from_config({**T5, "feed_forward_proj": "gated-gelu"}, name="t5-gated", source="local")
    sources = [i.source for i in adapter_inputs(gated, LoraConfig(rank=8, targets="all-linear"))]
    assert "encoder:DenseReluDense.wi_0" in sources and "decoder:DenseReluDense.wi_1" in sources
    assert adapter_inputs(spec_from_config(T5, name="t5", source="local"), LoraConfig(rank=8, dora=True)) is None


@pytest.mark.parametrize("config,targets,micro", [
    (T5, ("q", "v"), 2), (T5, "all-linear", 4), (BART, ("q_proj", "v_proj"), 2), (BART, "all-linear", 4),
], ids=["t5-qv", "t5-all", "bart-qv", "bart-all"])
def test_lora_plan_within_2_percent_of_the_simulated_step(config, targets, micro):
    pytest.importorskip("peft")
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.simulate.step import simulate
    from advisor.strategies import get_strategy
    from advisor.training import TrainingConfig

    lora = LoraConfig(rank=8, targets=targets)
    # T5 eager: the CPU simulator runs SDPA with T5's bias mask on the math kernel (ENCDEC_NOTE)
    training = TrainingConfig(seq_len=64, lora=lora, **({"attention": "eager"} if config is T5 else {}))
    spec = with_lora(spec_from_config(config, name=config["_name_or_path"], source="local"), lora)
    estimate = estimate_memory(spec, parse_gpus("2xH100"), training, get_strategy("ddp").on("torch"),
                               micro_batch_size=micro, checkpointing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = simulate(config, world_size=2, strategy="ddp", training=training, micro_batch_size=micro,
                            checkpointing=False)
    assert abs(estimate.peak_allocated - measured.peak_allocated) <= 0.02 * measured.peak_allocated
