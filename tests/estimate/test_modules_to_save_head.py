"""PEFT's ``modules_to_save`` naming the output head under the fused loss kernel (issue 19): PEFT trains a
copy of ``lm_head`` and ``ModulesToSaveWrapper.weight`` is that copy's, so the kernel reads a head that
trains and accumulates its fp32 weight gradient (V x h x 4 bytes) over the chunks, as for a full
fine-tune. The estimate used to count the head as a LoRA base's (frozen): 32,825,344 bytes short.

Tiny Llama (hidden 256, 2 blocks, vocabulary 32,000, untied), one GPU, DDP, bf16-mixed, micro-batch 2,
seq 512, no checkpointing, LoRA rank 8 on PEFT's defaults, --loss fused. Simulated with
``advisor simulate -m DIR -g 1xA100 --strategy ddp --micro-batch 2 --seq-len 512 --lora 8 --loss fused
--lora-modules-to-save lm_head --json`` (torch 2.13, transformers 5.23, PEFT 0.21.2): peak 235,308,480
bytes in forward (the kernel computes the head's gradient there); the estimate 234,748,416 (-0.24%). Before the
simulator allocated logsumexp's scratch beside the kernel's fp32 logits (``advisor.simulate.fake_env.
kernel_scratch``), 227,180,992 simulated and 226,621,952 estimated. The estimate before the fix: 199,797,248
(-12.05%, peak at the optimizer step).
"""

from __future__ import annotations

import pytest

from advisor.model.lora import LoraConfig
from advisor.planning.api import plan

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=688,
             num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=32000,
             max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="bfloat16",
             _name_or_path="tiny-llama-mts")
SIMULATED = 235_308_480
HEAD_GRADIENT = 32000 * 256 * 4  # the kernel's fp32 accumulator of the trained copy's weight gradient

pytestmark = pytest.mark.filterwarnings("ignore")


def _peak(saved: tuple[str, ...] | None) -> int:
    result = plan(dict(LLAMA), gpus="1xA100", cache_dir=None, strategy="ddp", micro_batch_size=2, seq_len=512,
                  activation_checkpointing="off", precision="bf16-mixed", loss="fused",
                  lora=LoraConfig(rank=8, modules_to_save=saved))
    return result.candidate("ddp").memory_bytes.peak_allocated


def test_trained_head_copy_under_fused_kernel_matches_simulated_step():
    peak = _peak(("lm_head",))
    assert abs(peak - SIMULATED) <= 0.005 * SIMULATED, (peak, SIMULATED)


def test_the_trained_copy_adds_its_gradient_accumulator_at_the_end_of_forward():
    result = plan(dict(LLAMA), gpus="1xA100", cache_dir=None, strategy="ddp", micro_batch_size=2, seq_len=512,
                  activation_checkpointing="off", precision="bf16-mixed", loss="fused",
                  lora=LoraConfig(rank=8, modules_to_save=("lm_head",)))
    frozen = plan(dict(LLAMA), gpus="1xA100", cache_dir=None, strategy="ddp", micro_batch_size=2, seq_len=512,
                  activation_checkpointing="off", precision="bf16-mixed", loss="fused", lora=LoraConfig(rank=8))
    moments = result.candidate("ddp").memory_bytes, frozen.candidate("ddp").memory_bytes
    # Beside the frozen base's plan: the copy's fp32 weight (PEFT upcasts what trains) and its two fp32 Adam
    # moments from the last step, the kernel's fp32 gradient accumulator, and autocast's bf16 copy of the
    # fp32 weight the kernel reads (the frozen bf16 head needs none): 4 + 8 + 4 + 2 bytes an element.
    assert moments[0].at_end_of_forward - moments[1].at_end_of_forward == 32000 * 256 * (4 + 8 + 2) + HEAD_GRADIENT
