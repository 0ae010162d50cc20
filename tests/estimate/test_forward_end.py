"""The end of forward (``MemoryBreakdown.at_end_of_forward``), against the simulated step.

Found by issue 20's sweep and read on the simulated step (advisor.simulate.step, torch 2.13, transformers 5.23):

- FSDP2 ZeRO-2 ends its forward with the last block's all-gather output still allocated (FSDP2 frees one when
  the next all-gather is waited on, and ZeRO-2 gathers nothing more); it is gone by the loss's backward. Row
  567628d4934e (a Gemma, ZeRO-2 on 8 ranks): the simulated forward held 9,537,536 bytes more than every block and
  the root unsharded, 2 x 4,768,768, one block in bf16;
- transformers' loss upcasts the logits with ``.float()``, which returns fp32 logits themselves: no copy in fp32.

Before the fix: -0.22% (row 6eeafbb79be7, Qwen3 ZeRO-2, pure bf16, fused loss: the end of forward decides) and
+5.69% once the first was fixed (row a58e44532dfb, Qwen3 ZeRO-2 fp32, the hf loss: a copy of 14.4 MB counted). Row
6eeafbb79be7 simulated 296,283,708 bytes until the simulator allocated logsumexp's scratch beside the fused kernel's
fp32 logits (``advisor.simulate.fake_env.kernel_scratch``): 362,610,236, the estimate -0.02%."""

from __future__ import annotations

import pytest

from advisor.estimate.activations import Dtypes
from advisor.estimate.activations_loss import loss_bytes
from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.sources import spec_from_config
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

QWEN3_WIDE_VOCAB = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=128, intermediate_size=480,
                        head_dim=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                        vocab_size=64896, max_position_embeddings=8192, tie_word_embeddings=True,
                        _name_or_path="sweep/qwen3-h128-l4-v64896")
QWEN3_FP32 = dict(QWEN3_WIDE_VOCAB, hidden_size=384, intermediate_size=960, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=6, vocab_size=7040, tie_word_embeddings=False,
                  _name_or_path="sweep/qwen3-h384-l2-v7040")


@pytest.mark.parametrize("cfg,gpus,options,simulated", [
    (QWEN3_WIDE_VOCAB, "16xH100", dict(seq_len=4096, precision="bf16", loss="fused", optimizer="adamw"),
     362_610_236),
    (QWEN3_FP32, "4xH100", dict(seq_len=512, precision="fp32", loss="hf", optimizer="adam"), 119_309_548),
], ids=["zero2-all-gather-output", "fp32-logits"])
def test_zero2_forward_matches_the_simulated_step(cfg, gpus, options, simulated):
    spec = spec_from_config(cfg, name=cfg["_name_or_path"], source="local")
    training = TrainingConfig(activation_checkpointing="selective", **options)
    memory = estimate_memory(spec, parse_gpus(gpus), training, get_strategy("zero2").on("torch"),
                             micro_batch_size=1, checkpointing=True)
    assert abs(memory.peak_allocated - simulated) <= 0.001 * simulated


def test_fp32_logits_are_not_copied():
    """512 tokens x 7,040: the logits and the log-softmax output, 4 bytes each (no .float() copy)."""
    forward, backward = loss_bytes("hf", tokens=512, vocab=7040, hidden=384,
                                   dt=Dtypes(residual=4, compute=4, input_casts=False))
    assert forward == 512 * 7040 * 8
    assert backward == 512 * 7040 * 12
