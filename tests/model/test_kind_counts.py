"""Encoder-decoder (T5) and state-space (Mamba) counts from the config equal ``sum(p.numel())`` of the
transformers model on the meta device (tiny configs built in code; the bundled T5-large and
Mamba-130m through tests/model/test_architectures.py)."""

from __future__ import annotations

import pytest

from advisor.model.architectures import count_from_config
from advisor.model.meta import build_meta_model

TINY_KINDS = {
    "t5_relu": dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=32, d_ff=48, d_kv=8,
                    num_heads=4, num_layers=2, vocab_size=100, decoder_start_token_id=0, pad_token_id=0),
    # T5 v1.1 style: gated GELU, fewer decoder layers, an untied head (its own lm_head, as from_pretrained keeps it).
    "t5_gated_uneven": dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=32, d_ff=40,
                            d_kv=12, num_heads=2, num_layers=3, num_decoder_layers=1, vocab_size=90,
                            feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                            relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0),
    # mT5 (mT0): T5 v1.1's modules under MT5 names, its head untied.
    "mt5_gated_untied": dict(model_type="mt5", architectures=["MT5ForConditionalGeneration"], d_model=32, d_ff=40,
                             d_kv=8, num_heads=4, num_layers=2, vocab_size=120, feed_forward_proj="gated-gelu",
                             tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0),
    "mamba_auto_rank": dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=40, num_hidden_layers=2,
                            state_size=8, conv_kernel=3, expand=2, vocab_size=120),
    "mamba_biases_untied": dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=32,
                                intermediate_size=80, num_hidden_layers=3, state_size=4, time_step_rank=5,
                                use_bias=True, use_conv_bias=False, tie_word_embeddings=False, vocab_size=64),
}


@pytest.mark.parametrize("name", sorted(TINY_KINDS))
def test_kind_counts_match_meta_device(name):
    cfg = TINY_KINDS[name]
    spec = count_from_config(cfg, name=name, source="local")
    assert spec is not None and spec.count_method == "formula"
    model = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    if spec.layer_params is not None:  # Mamba: identical blocks
        blocks = model.backbone.layers
        assert spec.layer_params == sum(p.numel() for p in blocks[0].parameters())
        assert len(blocks) == spec.num_layers
        assert spec.tied_embeddings == (model.lm_head.weight is model.backbone.embeddings.weight)


def test_vision_language_counts_match_meta_device():
    """Qwen2.5-VL: the Qwen2 language model by the decoder formula plus the vision tower and merger."""
    cfg = dict(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"], hidden_size=64,
               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=300, tie_word_embeddings=False,
               rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
               vision_config=dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, out_hidden_size=64,
                                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_chans=3,
                                  fullatt_block_indexes=[1], window_size=16))
    spec = count_from_config(cfg, name="vl", source="local")
    model = build_meta_model(cfg)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    visual = sum(p.numel() for p in model.model.visual.parameters())
    assert spec.other_params == visual + 64  # the tower and merger, and the language model's final norm


def test_images_per_sample_adds_image_tokens():
    """Qwen2.5-VL-7B: 14-pixel patches merged 2 x 2, one token per 28 x 28 pixels; a 448 x 448 image is
    (448 / 28)^2 = 256 tokens, so 2 images add 512 to the sequence; a text model rejects images."""
    from advisor.estimate.memory import image_tokens
    from advisor.model.sources import resolve_model
    from advisor.training import TrainingConfig

    vl = resolve_model("Qwen/Qwen2.5-VL-7B-Instruct")
    assert image_tokens(vl, TrainingConfig(images_per_sample=2)) == 512
    assert image_tokens(vl, TrainingConfig(images_per_sample=1, image_size=500)) == 18 * 18  # ceil(500 / 28)
    with pytest.raises(ValueError, match="vision-language"):
        image_tokens(resolve_model("Qwen/Qwen2.5-7B"), TrainingConfig(images_per_sample=1))


def test_a_stored_untied_t5_head_counts_as_from_pretrained_loads_it(tmp_path):
    """A T5 v1.1 checkpoint (its config: tie_word_embeddings false) stores lm_head apart from the shared
    embedding. transformers 5's T5Config sets the flag True, yet from_pretrained leaves a stored head that
    differs untied: the model trained holds both matrices. The formula and the meta build count what
    transformers itself loads here."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = TINY_KINDS["t5_gated_uneven"]
    model = T5ForConditionalGeneration(T5Config(**{k: v for k, v in cfg.items() if k != "model_type"}))
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))  # as a v1.1 file holds it
    model.save_pretrained(tmp_path)
    loaded = T5ForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is not loaded.shared.weight
    held = sum(p.numel() for p in loaded.parameters())
    spec = count_from_config(cfg, name="t5_gated_uneven", source="local")
    assert spec.total_params == held and not spec.tied_embeddings
    assert sum(p.numel() for p in build_meta_model(cfg).parameters()) == held
    assert spec.head_params == 90 * 32  # vocab x d_model
