"""Qwen2-VL's vision tower (``advisor.estimate.activations_vision.qwen2_vl_per_patch``) against what
autograd saves in a real tiny tower on the CPU (SDPA), and its count against the meta-device model."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from advisor.estimate.activations_vision import vision_per_patch
from advisor.model.kinds import qwen2_vl_vision_facts
from tests.saved_tensors import qwen_tower_saved_bytes

# embed_dim is the tower's width; hidden_size the merger's output (the language model's width).
VISION = dict(depth=2, embed_dim=64, hidden_size=96, mlp_ratio=4, num_heads=4, patch_size=4, spatial_merge_size=2,
              temporal_patch_size=2, in_channels=3)
GRID = 8  # one image of 8 x 8 patches


def _saved_bytes(dtype: torch.dtype) -> int:
    return qwen_tower_saved_bytes(Qwen2VisionTransformerPretrainedModel, Qwen2VLVisionConfig(**VISION), dtype, GRID)


@pytest.mark.parametrize("dtype,cb,cpu_stats_gap", [(torch.bfloat16, 2, 20), (torch.float32, 4, 0)])
def test_tower_matches_what_autograd_saves(dtype, cb, cpu_stats_gap):
    """Measured 433,408 bytes in bf16 (6,772 a patch) and 856,576 in fp32 (13,384): the count equals the
    fp32 figure; in bf16 the CPU keeps LayerNorm's mean and rstd in bf16, 4 bytes below the GPU's fp32
    ones for each of the 5 LayerNorms a patch passes (20 bytes a patch)."""
    est = GRID * GRID * vision_per_patch(cb, qwen2_vl_vision_facts(VISION))
    assert est - _saved_bytes(dtype) == GRID * GRID * cpu_stats_gap


def test_qwen2_vl_counts_match_meta_device():
    """The Qwen2 language model by the decoder formula plus Qwen2-VL's tower and merger."""
    from advisor.model.architectures import count_from_config
    from advisor.model.meta import build_meta_model

    cfg = dict(model_type="qwen2_vl", architectures=["Qwen2VLForConditionalGeneration"], hidden_size=64,
               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=300, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
               rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
               vision_config=dict(VISION, embed_dim=32, hidden_size=64, num_heads=2))
    spec = count_from_config(cfg, name="q2vl", source="local")
    model = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    assert spec.other_params == sum(p.numel() for p in model.model.visual.parameters()) + 64  # + the final norm
    assert spec.block_classes[0] == type(model.model.language_model.layers[0]).__name__ == "Qwen2VLDecoderLayer"
    assert (spec.image_token_pixels, spec.vision.kind) == (8, "qwen2_vl")  # 4-pixel patches merged 2 x 2
