"""Qwen2.5-VL's vision tower: the per-patch count (``advisor.estimate.activations_vision``) against what
autograd saves in a real tiny tower on the CPU (SDPA, windowed and full-attention blocks), and the
plan adding it for --images-per-sample."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from advisor.estimate.activations_vision import vision_per_patch
from advisor.model.kinds import qwen_vl_vision_facts
from tests.saved_tensors import qwen_tower_saved_bytes

VISION = dict(depth=2, hidden_size=64, intermediate_size=80, num_heads=4, out_hidden_size=96, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1], in_chans=3)
GRID = 8  # one image of 8 x 8 patches: four 4 x 4 windows in block 0, one image-wide attention in block 1


def _saved_bytes(dtype: torch.dtype) -> int:
    return qwen_tower_saved_bytes(Qwen2_5_VisionTransformerPretrainedModel, Qwen2_5_VLVisionConfig(**VISION), dtype, GRID)


@pytest.mark.parametrize("dtype,cb", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_tower_matches_what_autograd_saves(dtype, cb):
    """Measured 8,904 bytes a patch in bf16 (blocks 2,712 with the shared rotary tables + 2,584, merger 772,
    patch embedding 192, 4 of window-order indices the count leaves out); 14,564 in fp32."""
    est = GRID * GRID * vision_per_patch(cb, qwen_vl_vision_facts(VISION))
    measured = _saved_bytes(dtype)
    assert 0.995 * measured <= est <= measured, (est, measured)


def test_qwen25_vl_7b_tower_by_hand():
    """Qwen2.5-VL-7B's tower (32 blocks of width 1280, 16 heads, MLP 3420; 3 x 2 x 14 x 14 pixel values a
    patch; 2 x 2 merge) in bf16, a patch: each block's norms 2 x (8 x 1280 + 4) = 20,488, attention
    7 x 2 x 1280 + 4 x 16 = 17,984, MLP 4 x 2 x 3420 = 27,360: 65,832, x 32 = 2,106,624; the patch
    embedding 2 x 1176 = 2,352, rotary 2 x 4 x 80 = 640, the merger 8 x 1280 + 4 + 2 x 2 x 1280 = 15,364:
    2,124,980. A 448 x 448 image is 256 tokens of 4 patches: 2,175,979,520 bytes."""
    from advisor.estimate.activations_vision import vision_saved_bytes
    from advisor.model.sources import resolve

    spec, _ = resolve("Qwen/Qwen2.5-VL-7B-Instruct")
    assert vision_per_patch(2, spec.vision) == 2_124_980
    assert vision_saved_bytes(2, spec.vision, image_tokens=256) == 2_175_979_520
