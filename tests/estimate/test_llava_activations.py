"""Llava's CLIP tower and projector (``advisor.estimate.activations_vision.clip_per_image``) against what
autograd still holds at the end of a real tiny Llava's training forward on the CPU (SDPA), with and
without images: the difference is the tower's and the projector's share; and the plan adding it."""

from __future__ import annotations

import pytest
import torch
import transformers

from advisor.estimate.activations_llava import clip_per_image, clip_saved
from advisor.model.llava import clip_tower
from advisor.model.releases import installed_behaviours
from tests.saved_tensors import saved_forward_bytes

TEXT = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=128, vocab_size=1000, tie_word_embeddings=False)
# 32 x 32 images of 4 x 4 patches: 64 patches + CLS = 65 tower tokens, 64 image tokens; 3 layers, the
# last unused (vision_feature_layer -2).
VISION = dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=4, image_size=32, patch_size=4)
CONFIG = dict(text_config=TEXT, vision_config=VISION, image_token_index=999)
SEQ = 200
# The tower as the installed transformers runs it: from 5.24.0 the output keeps the tower's output, and
# its last layer (unused) stays saved (profiles/library_releases.json).
KEEPS = installed_behaviours().get("llava_output_keeps_vision_tower")
TOWER = clip_tower(CONFIG, output_keeps_tower=KEEPS)[1]


def _forward_bytes(dtype: torch.dtype, images: int, *, autocast: bool = False) -> int:
    config = transformers.LlavaConfig(**CONFIG)
    for sub in (config, config.text_config, config.vision_config):
        sub._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration._from_config(config).to(dtype).train()
    ids = torch.randint(0, 900, (1, SEQ), generator=torch.Generator().manual_seed(0))
    pixels = {}
    if images:
        ids[:, 10:10 + 64 * images] = 999  # the <image> placeholders the features replace
        pixels["pixel_values"] = torch.randn(images, 3, 32, 32, dtype=dtype)
    return saved_forward_bytes(model, autocast=autocast, input_ids=ids, labels=ids, **pixels)


@pytest.mark.parametrize("dtype,cb", [(torch.bfloat16, 2), (torch.float32, 4)])
@pytest.mark.parametrize("images", [1, 2])
def test_images_add_what_the_tower_count_says(dtype, cb, images):
    """Measured (less the 200-byte placeholder mask masked_scatter keeps), transformers 5.23.0: one image
    251,068 bytes in bf16 and 499,536 in fp32, two images 501,360 and 998,240; the count 252,240 / 499,408
    an image. transformers 5.24.0 (the unused third layer held): one image 348,308 in bf16; the count
    adds 65 tokens x 1,632 bytes a layer, less for one image alone 65 x 128 of its input, the projector's
    own: 350,000 (measured 348,308); two images 712,480 measured, 716,640 counted. It differs
    by the CPU keeping LayerNorm's mean and rstd in bf16 (5 norms x 65 tokens x 4 bytes = 1,300 an image
    below the GPU's fp32 ones), one image's projector input being a view of all 65 tokens (128 bytes in
    bf16 above the 64 counted) and the 65 position ids (520 bytes) being shared by the images of a batch."""
    measured = _forward_bytes(dtype, images) - _forward_bytes(dtype, 0) - SEQ
    est = clip_saved(cb, TOWER, images=images, residual=cb, input_casts=False)
    assert abs(est - measured) <= 0.007 * measured, (est, measured)


def test_autocast_adds_fp32_residuals_input_casts_and_weight_copies():
    """bf16-mixed without FSDP (autocast over fp32 weights, as DDP runs it): the residual stream and the
    LayerNorms' inputs are fp32, q, k and v each cast the LayerNorm's fp32 output, and the bf16 copies of
    the used layers', the patch convolution's and the projector's weights stay saved. Measured: two
    images add 790,936 bytes; the count 791,456 (137,216 of them weight copies): the 65 position ids (520
    bytes) are shared by the images of a batch and counted for each."""
    from advisor.estimate.activations_llava import clip_weight_casts

    measured = _forward_bytes(torch.float32, 2, autocast=True) - _forward_bytes(torch.float32, 0, autocast=True) - SEQ
    est = clip_saved(2, TOWER, images=2, residual=4, input_casts=True) + clip_weight_casts(TOWER)
    assert abs(est - measured) <= 0.005 * measured, (est, measured)


# llava-1.5-7b in bf16, one 336 x 336 image: 577 tokens. A used layer (23 of 24) a token: 8 x 2 x 1024
# + 4 x 16 (log-sum-exp) + 2 x 8 (LayerNorm stats) + 3 x 2 x 4096 (quick_gelu) = 41,040; x 23 = 943,920;
# pre_layrnorm 2 x 1024 + 8 and position id 8: 945,984 a token, x 577 = 545,832,768. Pixels 576 x 588 x 2
# = 677,376; projector 576 x 2 x (1024 + 2 x 4096) = 10,616,832. Total 557,126,976 bytes an image.
# transformers >= 5.24.0 holds the 24th layer too: + 577 x 41,040 = 23,680,080, 580,807,056 an image; an
# image alone in its micro-batch shares that layer's input with the projector's: - 577 x 2 x 1024 =
# 1,181,696, 579,625,360.
PER_IMAGE_7B = 557_126_976 if KEEPS is None else 580_807_056
ALONE_7B = 557_126_976 if KEEPS is None else 579_625_360


def test_llava_15_7b_tower_by_hand():
    """The hand count above, for the installed transformers."""
    from advisor.model.sources import resolve

    spec, _ = resolve("llava-hf/llava-1.5-7b-hf")
    assert clip_per_image(2, spec.vision, residual=2, input_casts=False) == PER_IMAGE_7B
    assert clip_saved(2, spec.vision, images=1, residual=2, input_casts=False) == ALONE_7B
    assert clip_saved(2, spec.vision, images=3, residual=2, input_casts=False) == 3 * PER_IMAGE_7B


def test_plan_adds_576_image_tokens_and_the_tower():
    """llava-1.5-7b under zero3 (FSDP2: bf16 compute, no autocast), micro-batch 1: one image at 2,048 text
    tokens equals 2,624 text tokens plus the tower, 557,126,976 bytes by hand (579,625,360 from transformers 5.24.0; above), at the loss
    backward; the plan says --image-size does not apply."""
    from advisor.planning.api import plan

    options = dict(strategy="zero3", micro_batch_size=1, activation_checkpointing="off")
    with_image = plan("llava-hf/llava-1.5-7b-hf", "2xA100", seq_len=2048, images_per_sample=1, image_size=1000,
                      **options)
    text_only = plan("llava-hf/llava-1.5-7b-hf", "2xA100", seq_len=2048 + 576, **options)
    at_loss = [p.candidate("zero3").memory_bytes.at_loss_backward for p in (with_image, text_only)]
    assert at_loss[0] - at_loss[1] == ALONE_7B
    assert any(a.startswith("images: 1 per sample x 576 tokens (every image resized") and "--image-size 1000 does "
               "not apply" in a for a in with_image.assumptions)


def test_lora_on_the_towers_layers_keeps_its_activations():
    """LoRA on q_proj, v_proj also adapts the CLIP tower (PEFT's name matching), so the tower must keep
    what its adapters' gradients need: counted as for a full fine-tune, the bytes by hand
    (test above). LoRA on o_proj only (CLIP's is out_proj) leaves the tower frozen: it saves nothing."""
    from advisor.model.lora import LoraConfig
    from advisor.planning.api import plan

    def at_loss(targets: tuple[str, ...], images: int, seq_len: int) -> int:
        options = dict(strategy="zero3", micro_batch_size=1, activation_checkpointing="off",
                       lora=LoraConfig(rank=16, targets=targets))
        result = plan("llava-hf/llava-1.5-7b-hf", "2xA100", seq_len=seq_len, images_per_sample=images, **options)
        return result.candidate("zero3").memory_bytes.at_loss_backward

    assert at_loss(("q_proj", "v_proj"), 1, 2048) - at_loss(("q_proj", "v_proj"), 0, 2048 + 576) == ALONE_7B
    assert at_loss(("o_proj",), 1, 2048) - at_loss(("o_proj",), 0, 2048 + 576) == 0
