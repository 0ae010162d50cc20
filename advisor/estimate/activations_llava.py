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
last used one (vision_feature_layer -2: the last) run; before transformers 5.24.0 their graph is freed
with the tower's outputs before the loss (modeling_llava.py kept only the projected features); from
5.24.0 the model's output keeps the tower's output, so they stay saved while it is alive
(``ClipTowerFacts.held_layers``; the first of them saves as its input the storage the projector saved,
when no cast sits between: one feature layer, no autocast).

Measured (what autograd still holds after a Llava's training forward, with and without images):
a tiny Llava in pure bf16 and fp32 (``tests/estimate/test_llava_activations.py``), and the scaled
Llava of ``benchmarks/model_kinds.py`` under CPU autocast over fp32 weights: 46,262,620 bytes an
image plus 20,525,056 of weight copies, as counted here.
"""

from __future__ import annotations

from advisor.model.llava import ClipTowerFacts
from advisor.precision import FP32


LLAVA_NOTE = ("Llava: activations are the language model's over the text tokens plus the image tokens of "
              "--images-per-sample (default 0; (side / patch)^2 an image, 576 for llava-1.5: each image is resized to "
              "the CLIP tower's side, so --image-size does not apply), the CLIP tower's over those patches and CLS up "
              "to its last used layer (SDPA or flash attention, not checkpointed) and the projector's; eager "
              "attention in the tower is not modelled; under --lora the tower and projector save nothing unless "
              "the targets match the tower's layers too (PEFT's q_proj/v_proj names match CLIP's: those adapters "
              "are counted, and the tower's activations then as for a full fine-tune, an overestimate)")


def llava_release_note(tower: ClipTowerFacts) -> str | None:
    """The assumption a release behaviour adds to a Llava plan, or None where the older behaviour holds."""
    if not tower.output_keeps_tower or tower.held_layers == tower.used_layers:
        return None
    unused = tower.held_layers - tower.used_layers
    return (f"{tower.output_keeps_tower} (installed): Llava's output keeps the CLIP tower's output, so its "
            f"{unused} layer(s) after vision_feature_layer stay saved while the output is alive and are counted; "
            f"a loop that drops the output before backward (HF Trainer's compute_loss does) frees them, and the "
            f"tower's estimate is then high by {unused} of {tower.held_layers} layers "
            f"(profiles/library_releases.json)")


def clip_per_image(cb: int, tower: ClipTowerFacts, *, residual: int, input_casts: bool) -> int:
    """Bytes one image leaves saved in the tower and projector at the end of the forward (module docstring)."""
    w, i, r = tower.width, tower.intermediate_size, residual
    mlp = (3 if tower.activation == "quick_gelu" else 2) * cb * i
    qkv_input = (3 if input_casts else 1) * cb * w
    layer = 2 * r * w + qkv_input + 5 * cb * w + FP32 * tower.num_heads + 2 * 2 * FP32 + mlp
    per_token = tower.held_layers * layer + r * w + 2 * FP32 + 8
    pixels = (tower.tokens - 1) * tower.patch_values * cb
    projector = tower.image_tokens * cb * (tower.projector_in + 2 * tower.projector_out)
    return tower.tokens * per_token + pixels + projector


def clip_saved(cb: int, tower: ClipTowerFacts, *, images: int, residual: int, input_casts: bool) -> int:
    """Bytes ``images`` images of one micro-batch leave saved (``clip_per_image`` each). One image alone,
    with the layers after the feature layer held, uncast and one feature layer: the projector's input
    is a view of the feature layer's output, which the next layer saves as its input too (one storage,
    counted once); with two or more images that view cannot be flattened and linear_1 saves a copy."""
    total = images * clip_per_image(cb, tower, residual=residual, input_casts=input_casts)
    if images == 1 and tower.held_layers > tower.used_layers and not input_casts and tower.projector_shares_feature:
        total -= tower.tokens * residual * tower.width
    return total


def clip_weight_casts(tower: ClipTowerFacts) -> int:
    """The bf16 copies of the tower's and projector's weights that autocast makes and autograd saves
    for the input gradients, once a micro-batch with images: the used layers' four attention and two
    MLP matrices, the patch convolution and both projector matrices (aten autocast_mode.cpp caches the
    cast of a leaf weight; its bias and the LayerNorms need no saved copy)."""
    w, i = tower.width, tower.intermediate_size
    layers = tower.held_layers * (4 * w * w + 2 * w * i)
    conv = tower.patch_values * w
    projector = tower.projector_in * tower.projector_out + tower.projector_out * tower.projector_out
    return 2 * (layers + conv + projector)
