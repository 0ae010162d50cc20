"""Activation memory of Llava's CLIP vision tower and projector, per image (transformers 5.x
``modeling_llava.py`` with ``modeling_clip.py``'s ``CLIPVisionModel``), under SDPA or flash attention.

What belongs here: what one image leaves saved for backward in the tower and the 2-layer projector,
and the bf16 weight copies autocast keeps for them. The language model's share of the image tokens
is the decoder's (``advisor.estimate.activations``: image tokens are added to the sequence); the
dispatch between vision towers is ``advisor.estimate.activations_vision``. Pure functions.

Per token and used layer (W the width, I the MLP width, H heads, r the residual stream's bytes,
cb the compute bytes): both LayerNorms' inputs (2 r W), the q, k, v projections' input (the first
LayerNorm's output, cb W; under autocast each projection casts the fp32 output itself: 3 cb W),
q, k, v (3 cb W: SDPA's inputs, views of the projections' outputs), the attention output (cb W: the
out projection's input, the same storage), fc1's input (cb W), SDPA's fp32 log-sum-exp (4 H), each
LayerNorm's fp32 mean and rstd on a GPU (2 x 8); the MLP: fc1's output and fc2's input (2 cb I),
and quick_gelu's sigmoid (cb I; x * sigmoid(1.702 x), transformers activations.py). Per token once:
pre_layrnorm's input (r W) and stats, the position ids (int64). Per image: the pixels the patch
convolution saves; per image token the projector's input (the last used layer's output without
CLS), linear_1's output (GELU's input) and GELU's output (linear_2's input). The layers after the
last used one (vision_feature_layer -2: the last) run, but their graph is freed with the tower's
outputs before the loss (modeling_llava.py keeps only the projected features).

Measured (what autograd still holds after a Llava's training forward, with and without images):
a tiny Llava in pure bf16 and fp32 (``tests/estimate/test_llava_activations.py``), and the scaled
Llava of ``benchmarks/model_kinds.py`` under CPU autocast over fp32 weights: 46,262,620 bytes an
image plus 20,525,056 of weight copies, as counted here.
"""

from __future__ import annotations

from advisor.model.llava import ClipTowerFacts

FP32 = 4

LLAVA_NOTE = ("Llava: activations are the language model's over the text tokens plus the image tokens of "
              "--images-per-sample (default 0; (side / patch)^2 an image, 576 for llava-1.5: each image is resized to "
              "the CLIP tower's side, so --image-size does not apply), the CLIP tower's over those patches and CLS up "
              "to its last used layer (SDPA or flash attention, not checkpointed) and the projector's; eager "
              "attention in the tower is not modelled; under --lora the tower and projector save nothing unless "
              "the targets match the tower's layers too (PEFT's q_proj/v_proj names match CLIP's: those adapters "
              "are counted, and the tower's activations then as for a full fine-tune, an overestimate)")


def clip_per_image(cb: int, tower: ClipTowerFacts, *, residual: int, input_casts: bool) -> int:
    """Bytes one image leaves saved in the tower and projector at the end of the forward (module docstring)."""
    w, i, r = tower.width, tower.intermediate_size, residual
    mlp = (3 if tower.activation == "quick_gelu" else 2) * cb * i
    qkv_input = (3 if input_casts else 1) * cb * w
    layer = 2 * r * w + qkv_input + 5 * cb * w + FP32 * tower.num_heads + 2 * 2 * FP32 + mlp
    per_token = tower.used_layers * layer + r * w + 2 * FP32 + 8
    pixels = (tower.tokens - 1) * tower.patch_values * cb
    projector = tower.image_tokens * cb * (tower.projector_in + 2 * tower.projector_out)
    return tower.tokens * per_token + pixels + projector


def clip_weight_casts(tower: ClipTowerFacts) -> int:
    """The bf16 copies of the tower's and projector's weights that autocast makes and autograd saves
    for the input gradients, once a micro-batch with images: the used layers' four attention and two
    MLP matrices, the patch convolution and both projector matrices (aten autocast_mode.cpp caches the
    cast of a leaf weight; its bias and the LayerNorms need no saved copy)."""
    w, i = tower.width, tower.intermediate_size
    layers = tower.used_layers * (4 * w * w + 2 * w * i)
    conv = tower.patch_values * w
    projector = tower.projector_in * tower.projector_out + tower.projector_out * tower.projector_out
    return 2 * (layers + conv + projector)
