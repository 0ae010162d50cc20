"""LoRA on GPT-2 and GPT-NeoX: their own activation formulas count a full fine-tune's activations, so a
LoRA plan traces the model with PEFT's adapters instead (``advisor.estimate.traced.needs_trace``).
Compared with the simulated PEFT step. CPU only, no network.

Tiny configs: hidden 64, 4 heads, 2 blocks, vocabulary 1,024; DDP on one GPU, bf16-mixed, micro-batch 2,
seq 1024, no checkpointing, LoRA rank 8 on PEFT's default targets (GPT-NeoX query_key_value 64 -> 192,
GPT-2 c_attn 64 -> 192: 8 x (64 + 192) = 2,048 per block, 4,096 in all).
"""

from __future__ import annotations


import pytest

from advisor.model.lora import LoraConfig
from advisor.planning.api import plan

NEOX = dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], hidden_size=64, intermediate_size=256,
            num_hidden_layers=2, num_attention_heads=4, vocab_size=1024, max_position_embeddings=2048,
            rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False,
            _name_or_path="tiny-neox")
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=2, n_head=4, n_positions=2048,
            vocab_size=1024, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            _name_or_path="tiny-gpt2")
# advisor.simulate.step.simulate(cfg, world_size=1, strategy="ddp", training=<the plan's training>,
# micro_batch_size=2, checkpointing=False).peak_allocated (torch 2.13, transformers 5.x, peft 0.21). The
# formulas gave 35,892,736 (+11.4%) and 48,606,720 (+7.0%): a full fine-tune's activations.
SIMULATED = {"gpt_neox": 32_206_888, "gpt2": 45_445_656}


pytestmark = pytest.mark.filterwarnings("ignore")  # transformers / PEFT warnings at model build


@pytest.mark.parametrize("cfg", [GPT2, NEOX], ids=["gpt2", "gpt_neox"])
def test_lora_plan_traces_and_matches_the_simulated_step(cfg):
    result = plan(dict(cfg), gpus="1xH100", cache_dir=None, strategy="ddp", micro_batch_size=2, seq_len=1024,
                  activation_checkpointing="off", precision="bf16-mixed", lora=LoraConfig(rank=8))
    assert result.model.trainable_params == 4_096
    assert any("activations traced with PEFT's adapters" in note for note in result.assumptions)
    peak = result.candidate("ddp").memory_bytes.peak_allocated
    simulated = SIMULATED[cfg["model_type"]]
    assert abs(peak - simulated) <= 0.002 * simulated, (peak, simulated)
