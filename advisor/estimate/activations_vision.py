"""Activation memory of a vision-language model's vision tower (Qwen2.5-VL), per image patch; Llava's
CLIP tower and projector are ``advisor.estimate.activations_llava``'s, dispatched from here.

What belongs here: what one patch leaves saved for backward in ``Qwen2_5_VisionTransformerPretrainedModel``
(transformers 5.x ``modeling_qwen2_5_vl.py``) under SDPA or flash attention: the patch embedding,
every vision block and the patch merger. The language model's share of the image tokens is the
decoder's (``advisor.estimate.activations``: image tokens are added to the sequence). Pure functions.

Per patch and block (W the width, I the MLP width, cb the compute bytes): two RMSNorms, each its
fp32 input, the normalised value cast back and its output (the next linear's input) plus a 4-byte
rsqrt; the fused qkv output kept whole (v is a view of it, 3 W), q and k after the vision rotary
(W each), the attention output (W, window by window or image by image: the same total) and its fp32
log-sum-exp (one per head), proj's input (W); the gated MLP's gate and up outputs, act(gate) and
the product (4 I). Model-wide: the patch embedding's input pixels (channels x temporal x patch^2),
the rotary cos and sin (fp32, head width each), and the merger's RMSNorm (fp32 input, cast, output,
rsqrt) and its GELU's input and output (4 W merged over 4 patches: 2 W a patch, for a 2 x 2 merge).
Listed with ``saved_tensors_hooks`` on a tiny tower (W 64, 4 heads, I 80, 64 patches in 4 windows):
2,584 bytes a patch a block in bf16 and 4,632 in fp32, the merger 772 and 1,284, the patch embedding
192 and 384, equal to this count (``tests/estimate/test_vision_activations.py``).

Not modelled (``VISION_NOTE``): eager attention over the windows (scores per window), autocast casts
inside the tower, checkpointing of the vision blocks (they are counted whole: the wrappers checkpoint
the language model's blocks), video (more than one temporal patch).
"""

from __future__ import annotations

from advisor.estimate.activations_llava import LLAVA_NOTE, clip_saved, llava_release_note
from advisor.model.kinds import VisionFacts
from advisor.model.llava import ClipTowerFacts
from advisor.precision import FP32


VISION_NOTE = ("vision-language model: activations are the language model's over the text tokens plus the image "
               "tokens of --images-per-sample (default 0), and the vision tower's over each image's patches (merge^2 "
               "per image token) as SDPA or flash attention runs it, its blocks not checkpointed; eager attention over "
               "the tower's windows, autocast casts inside it and video frames are not modelled")


def qwen2_vl_per_patch(cb: int, vision: VisionFacts) -> int:
    """Qwen2-VL's tower (modeling_qwen2_vl.py), a patch: per block two LayerNorms, each its input and
    output plus fp32 mean and rstd on a GPU (8 bytes), the same attention as Qwen2.5-VL's (7 W, log-sum-
    exp), and the fc1 / quick_gelu / fc2 MLP: fc1's output, the sigmoid and fc2's input (3 I); the
    merger's LayerNorm (input, output, stats) and its GELU's input and output; the patch embedding's
    pixels and the rotary tables as Qwen2.5-VL's."""
    w, i = vision.width, vision.intermediate_size
    norm = 2 * cb * w + 2 * FP32
    block = 2 * norm + 7 * cb * w + FP32 * vision.num_heads + 3 * cb * i
    merger = norm + 2 * cb * w * vision.merge * vision.merge // 4
    rotary = 2 * FP32 * (w // vision.num_heads)
    return vision.depth * block + cb * vision.patch_values + rotary + merger


def vision_per_patch(cb: int, vision: VisionFacts) -> int:
    """Bytes one patch leaves saved in the whole tower (every block, the patch embedding, rotary, merger)."""
    if vision.kind == "qwen2_vl":
        return qwen2_vl_per_patch(cb, vision)
    w, i = vision.width, vision.intermediate_size
    norms = 2 * ((FP32 + 2 * cb) * w + FP32)
    attention = 7 * cb * w + FP32 * vision.num_heads  # qkv (3 W), rotated q and k, output, proj input; lse
    block = norms + attention + 4 * cb * i
    merged = 2 * cb * w * vision.merge * vision.merge // 4  # GELU's input and output, merge^2 W per merge^2 patches
    merger = (FP32 + 2 * cb) * w + FP32 + merged
    rotary = 2 * FP32 * (w // vision.num_heads)
    return vision.depth * block + cb * vision.patch_values + rotary + merger


def vision_note(model_type: str | None, vision: VisionFacts | ClipTowerFacts | None = None) -> str:
    """The plan's note for a vision-language model (a Llava's with the release behaviour its tower was counted under)."""
    if model_type != "llava":
        return VISION_NOTE
    release = llava_release_note(vision) if isinstance(vision, ClipTowerFacts) else None
    return LLAVA_NOTE if release is None else f"{LLAVA_NOTE}; {release}"


def vision_saved_bytes(cb: int, vision: VisionFacts | ClipTowerFacts, *, image_tokens: int, residual: int | None = None,
                       input_casts: bool = False) -> int:
    """The tower's saved bytes for ``image_tokens`` language-model tokens of images (Qwen2.5-VL: merge^2
    patches each, at ``cb`` bytes throughout; Llava: ``image_tokens`` tokens an image, its residual
    stream at ``residual`` bytes and, under autocast, each linear's own cast of an fp32 input)."""
    if isinstance(vision, ClipTowerFacts):
        return clip_saved(cb, vision, images=image_tokens // vision.image_tokens, residual=residual or cb,
                          input_casts=input_casts)
    return image_tokens * vision.merge * vision.merge * vision_per_patch(cb, vision)
