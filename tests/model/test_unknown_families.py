"""A config of a family with no formula keeps what the config says (issue 10, item 5): Mamba's
vocabulary, width and depth; Llava's language model fields with the vision tower counted. The note
says which formula is missing, never 'pass a config'."""

from __future__ import annotations

import pytest
import transformers

from advisor.estimate.activations import Dtypes, estimate_activations, shape_of
from advisor.model.sources import resolve_model
from advisor.planning.api import plan

MAMBA = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, state_size=4, architectures=["MambaForCausalLM"])
LLAMA_TEXT = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=128, vocab_size=1000, tie_word_embeddings=False)
CLIP_VISION = dict(model_type="clip_vision_model", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, image_size=32, patch_size=8)
# Llava by hand. Language model (Llama): embeddings 1000*64 = 64,000; one layer q,k,v,o 4*64*64 =
# 16,384 + gated MLP 3*64*128 = 24,576 + two RMSNorms 128 = 41,088; final norm 64; untied head 64,000.
# Vision tower (CLIP, 32x32 images, 8x8 patches): class token 32 + patch conv 3*8*8*32 (no bias) +
# positions 17*32 = 6,720; pre/post LayerNorms 2*64; two layers of 4*(32*32+32) + 32*64+64 + 64*32+32
# + 2*64 = 8,544. Projector 32->64->64 with biases: 2,112 + 4,160.
LLAVA_LANGUAGE = 64_000 + 2 * 41_088 + 64 + 64_000
LLAVA_VISION = 6_720 + 2 * 64 + 2 * 8_544
LLAVA_TOTAL = LLAVA_LANGUAGE + LLAVA_VISION + 2_112 + 4_160  # 240,448


@pytest.fixture
def mamba_dir(tmp_path):
    transformers.MambaConfig(**MAMBA).save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.fixture
def llava_dir(tmp_path):
    transformers.LlavaConfig(text_config=LLAMA_TEXT, vision_config=CLIP_VISION, image_token_index=999,
                             architectures=["LlavaForConditionalGeneration"]).save_pretrained(tmp_path)
    return str(tmp_path)


def test_mamba_spec_carries_the_config(mamba_dir):
    spec = resolve_model(mamba_dir)
    assert (spec.model_type, spec.vocab_size, spec.hidden_size, spec.num_layers) == ("mamba", 1000, 64, 2)
    shape = shape_of(spec)
    assert (shape.vocab_size, shape.hidden_size, shape.num_layers) == (1000, 64, 2)
    # Mamba has its own activation model now (advisor.estimate.activations_ssm): the note says which scan.
    assert shape.note.startswith("Mamba: activations of transformers' reference PyTorch scan")
    assert "fused CUDA kernels" in shape.note and "not modelled" in shape.note


def test_mamba_logits_follow_its_vocabulary(mamba_dir):
    """Micro-batch 64 x 2048 tokens, vocabulary 1000, bf16 logits + their fp32 copy + fp32 log-softmax
    (2 + 4 + 4 bytes a logit): 64 * 2048 * 1000 * 10 = 1,310,720,000 bytes; the loss backward's three
    fp32 N x V tensors: 64 * 2048 * 1000 * 12 = 1,572,864,000. (A 32,000 vocabulary, the size-only
    guess, made these 42 GB and 50 GB.)"""
    acts = estimate_activations(shape_of(resolve_model(mamba_dir)), Dtypes(residual=4, compute=2, input_casts=True),
                                micro_batch_size=64, seq_len=2048, checkpointing=False, eager=False)
    assert acts.logits_bytes == 1_310_720_000
    assert acts.loss_transient_bytes == 1_572_864_000
    result = plan(mamba_dir, gpus="1xA100", micro_batch_size=64, seq_len=2048, strategy="ddp")
    memory = result.candidate("ddp").memory_bytes
    # The temporary at the loss is that N x V transient plus buffers of a 120K-parameter model (< 2 MB).
    assert memory.temporary <= 1_572_864_000 + 2_000_000


def test_mamba_plan_note_is_accurate(mamba_dir):
    result = plan(mamba_dir, gpus="1xA100", micro_batch_size=1, strategy="ddp")
    step_notes = result.candidate("ddp").step_time.notes
    notes = " ".join(result.assumptions + step_notes)
    assert "Mamba: activations of transformers' reference PyTorch scan" in notes
    assert "pass a config" not in notes and "only the size is known" not in notes
    assert any(n.startswith("Mamba: FLOPs count the matmuls") for n in step_notes)


def test_llava_language_model_fields_and_vision_tower_counted(llava_dir):
    spec = resolve_model(llava_dir)
    assert spec.total_params == LLAVA_TOTAL
    assert (spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_attention_heads) == (1000, 64, 2, 4)
    assert (spec.block_classes, spec.layer_params) == (("LlamaDecoderLayer", "CLIPEncoderLayer"), 41_088)
    shape = shape_of(spec)
    assert shape.family == "decoder" and shape.vocab_size == 1000
    # Llava has its own count and tower model now (advisor.model.llava, activations_vision): the note says so.
    assert spec.count_method == "formula" and shape.note.startswith("Llava: activations are the language model's")
    notes = " ".join(plan(llava_dir, gpus="1xA100", micro_batch_size=1, strategy="ddp").assumptions)
    assert "Llava: activations" in notes and "pass a config" not in notes


def test_known_family_has_no_note():
    assert shape_of(resolve_model("Qwen/Qwen2.5-7B")).note is None
    assert shape_of(resolve_model("openai-community/gpt2")).note is None


def test_size_only_still_says_pass_a_config():
    assert "pass a config" in shape_of(resolve_model("7.5B")).note
