"""--loss chunked|fused on traced families whose decoder is not ``.model`` (GPT-NeoX's ``gpt_neox``) or whose head
has a bias (Phi's ``lm_head``): the plan (the family traced with the kernel on, ``advisor.simulate.profile``)
against the simulated step at a micro-batch beyond the traced ones (the kernels' bend, ``estimate.traced``)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=2048,
              tie_word_embeddings=False, max_position_embeddings=2048)
GPT_NEOX = dict(COMMON, model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], intermediate_size=256,
                rotary_pct=0.25, hidden_act="gelu", _name_or_path="test/gpt-neox-tiny")
PHI = dict(COMMON, model_type="phi", architectures=["PhiForCausalLM"], intermediate_size=256, num_key_value_heads=2,
           partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0, _name_or_path="test/phi-tiny")


@pytest.mark.parametrize("cfg, loss, strategy", [(GPT_NEOX, "fused", "zero3"), (GPT_NEOX, "chunked", "ddp"),
                                                 (PHI, "fused", "ddp"), (PHI, "chunked", "zero3")],
                         ids=["gpt_neox-fused", "gpt_neox-chunked", "phi-fused", "phi-chunked"])
def test_kernel_estimate_of_a_traced_family_is_the_simulated_step(cfg, loss, strategy):
    from advisor.planning.api import plan
    from advisor.simulate.step import simulate

    warnings.filterwarnings("ignore")
    result = plan(dict(cfg), gpus="2xH100", strategy=strategy, micro_batch_size=4, seq_len=128,
                  activation_checkpointing="off", precision="bf16-mixed", loss=loss, optimizer="adamw", cache_dir=None)
    estimated = result.candidate(strategy).memory_bytes.peak_allocated
    step = simulate(dict(cfg), world_size=2, strategy=strategy, training=result.training, micro_batch_size=4,
                    checkpointing=False)
    assert abs(estimated - step.peak_allocated) / step.peak_allocated < 0.01, (estimated, step.peak_allocated)
