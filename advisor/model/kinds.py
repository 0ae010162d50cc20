"""Exact parameter counts of encoder-decoder (T5, BART) and state-space (Mamba) models from a
``config.json`` dict, without torch.

What belongs here: the module trees of ``modeling_t5.py``, ``modeling_bart.py`` and ``modeling_mamba.py`` (transformers
5.x) as arithmetic, each checked against ``sum(p.numel())`` of the model built on the meta device
(``tests/model/test_kind_counts.py``). Mamba's activations: ``advisor.estimate.activations_ssm``;
T5's and BART's: ``advisor.estimate.activations_encdec``. An encoder-decoder's encoder and
decoder blocks differ, so it reports no single ``layer_params``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.config_keys import config_flag, config_value as _get

if TYPE_CHECKING:
    from advisor.model.spec import ModelSpec


class SsmFacts(BaseModel):
    """Mamba-1 mixer widths the activation model needs (``advisor.estimate.activations_ssm``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_size: int = Field(ge=1, description="SSM state per channel (N).")
    conv_kernel: int = Field(ge=1, description="Depthwise convolution width.")
    time_step_rank: int = Field(ge=1, description="dt projection rank.")


class EncDecFacts(BaseModel):
    """What the encoder-decoder activation model needs beyond the shared shape fields
    (``advisor.estimate.activations_encdec``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_encoder_layers: int = Field(ge=1)
    num_decoder_layers: int = Field(ge=1)
    activation: str = Field(description="Feed-forward activation (T5's dense_act_fn: relu, gelu_new, ...).")
    gated: bool = Field(description="Gated feed-forward (T5 v1.1 / flan: wi_0, wi_1, wo).")
    kind: str = Field(default="t5", description="t5 (RMS norms, relative position bias, pre-norm) or bart "
                      "(LayerNorm after each sublayer, learned positions, biases).")
    activation_dropout: bool = Field(default=False, description="BART: dropout after the feed-forward activation.")
    # What the step-time FLOPs need (advisor.estimate.step_time): each stack's layers run on their own tokens.
    encoder_params: int = Field(ge=0, description="All encoder layers (no embeddings, position tables or final norm).")
    decoder_params: int = Field(ge=0, description="All decoder layers, cross-attention included.")
    cross_kv_params: int = Field(ge=0, description="The decoder's cross-attention k and v projections, all layers: "
                                 "they read the encoder's output, so they run on the source tokens.")


def gated_encdec(spec: ModelSpec) -> bool:
    """An encoder-decoder with T5 v1.1 / flan's gated feed-forward (``EncDecFacts.gated``: wi_0, wi_1, wo)."""
    return spec.encdec is not None and spec.encdec.gated


class VisionFacts(BaseModel):
    """Qwen2.5-VL vision tower widths the activation model needs (``advisor.estimate.activations_vision``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    depth: int = Field(ge=1, description="Vision blocks.")
    width: int = Field(ge=1, description="Vision hidden size.")
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1, description="Vision gated MLP width.")
    patch_values: int = Field(ge=1, description="Pixel values per patch (channels x temporal x patch x patch).")
    merge: int = Field(ge=1, description="Patches merged per side into one language-model token.")
    kind: Literal["qwen2_5_vl", "qwen2_vl"] = Field(
        default="qwen2_5_vl", description="Block kind: Qwen2.5-VL (RMSNorm, gated SiLU MLP) or Qwen2-VL (LayerNorm "
        "with bias, fc1 / quick_gelu / fc2 MLP).")


def qwen_vl_vision_facts(vision: dict) -> VisionFacts:
    """The same keys and defaults as ``qwen_vl_vision_params``."""
    patch, temporal = vision.get("patch_size", 14), vision.get("temporal_patch_size", 2)
    return VisionFacts(depth=vision.get("depth", 32), width=vision.get("hidden_size", 1280),
                       num_heads=vision.get("num_heads", 16), intermediate_size=vision.get("intermediate_size", 3420),
                       patch_values=vision.get("in_chans", vision.get("in_channels", 3)) * temporal * patch * patch,
                       merge=vision.get("spatial_merge_size", 2))


def _whole(*values: object) -> bool:
    """All positive integers: anything else goes to the meta device, whose config class says what is wrong."""
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def t5_parts(cfg: dict, architecture: str | None) -> dict | None:
    """T5ForConditionalGeneration (and mT5's MT5ForConditionalGeneration, the same modules: modeling_mt5.py is
    modeling_t5.py renamed, less the decoder output's scaling, which the untied T5 v1.1 skips too): one shared
    embedding (the encoder's and the decoder's), and the LM head
    tied to it unless the config says ``tie_word_embeddings: false`` (T5 v1.1, Flan-T5, T0: their checkpoints
    hold ``lm_head.weight`` apart; transformers 5's T5Config sets the flag True whatever the file says, but
    ``from_pretrained`` leaves a stored head that differs from ``shared`` untied, modeling_utils.tie_weights,
    so the model a user trains has it, ``advisor.model.meta.untie_stored_head``); encoder blocks of self-attention
    (q, k, v, o without biases; relative position buckets x heads in the first block only) and a
    feed-forward (wi, wo; wi_0, wi_1, wo when gated), each behind a T5LayerNorm (weight only);
    decoder blocks add cross-attention and its norm; a final norm per stack."""
    if architecture not in (None, "T5ForConditionalGeneration", "MT5ForConditionalGeneration"):
        return None
    d, d_ff, d_kv = cfg.get("d_model", 512), cfg.get("d_ff", 2048), cfg.get("d_kv", 64)
    heads, vocab = cfg.get("num_heads", 8), _get(cfg, "vocab_size", default=32128)
    n_enc = cfg.get("num_layers", 6)
    n_dec = cfg.get("num_decoder_layers") or n_enc
    buckets = cfg.get("relative_attention_num_buckets", 32)
    if not _whole(d, d_ff, d_kv, heads, vocab, n_enc, n_dec, buckets):
        return None
    proj = str(cfg.get("feed_forward_proj", "relu"))
    gated = proj.startswith("gated-")
    act = proj.split("-")[-1]
    act = "gelu_new" if act == "gelu" else act  # T5Config maps gated-gelu to gelu_new
    attention = 4 * d * heads * d_kv
    ff = (3 if gated else 2) * d * d_ff
    enc_layers, dec_layers = n_enc * (attention + ff + 2 * d), n_dec * (2 * attention + ff + 3 * d)
    encoder = enc_layers + buckets * heads + d
    decoder = dec_layers + buckets * heads + d
    tied = config_flag(cfg, "tie_word_embeddings", True)
    return dict(embedding_params=vocab * d, head_params=0 if tied else vocab * d, other_params=encoder + decoder,
                tied_embeddings=tied, num_layers=n_enc + n_dec, hidden_size=d, num_attention_heads=heads,
                num_kv_heads=heads, head_dim=d_kv, intermediate_size=d_ff, vocab_size=vocab, gated_mlp=gated,
                encdec=EncDecFacts(num_encoder_layers=n_enc, num_decoder_layers=n_dec, activation=act, gated=gated,
                                   encoder_params=enc_layers, decoder_params=dec_layers,
                                   cross_kv_params=n_dec * 2 * d * heads * d_kv))


def bart_parts(cfg: dict, architecture: str | None) -> dict | None:
    """BartForConditionalGeneration: one shared embedding (both stacks' token embeddings and the LM
    head, tied); per stack learned positions (max_position_embeddings + 2 rows: BART offsets ids by 2)
    and an embedding LayerNorm; encoder layers of self-attention (q, k, v, o with biases), a LayerNorm,
    fc1 and fc2 with biases and a LayerNorm; decoder layers add cross-attention and its LayerNorm; a
    final LayerNorm per stack only with ``add_final_layer_norm`` (mBART); ``final_logits_bias`` is a
    buffer (modeling_bart.py, transformers 5.x)."""
    if architecture not in (None, "BartForConditionalGeneration"):
        return None
    d, vocab, pos = cfg.get("d_model", 1024), _get(cfg, "vocab_size", default=50265), cfg.get("max_position_embeddings", 1024)
    n_enc, n_dec = cfg.get("encoder_layers", 12), cfg.get("decoder_layers", 12)
    f_enc, f_dec = cfg.get("encoder_ffn_dim", 4096), cfg.get("decoder_ffn_dim", 4096)
    heads = cfg.get("encoder_attention_heads", 16)
    if not _whole(d, vocab, pos, n_enc, n_dec, f_enc, f_dec, heads) or f_enc != f_dec \
            or heads != cfg.get("decoder_attention_heads", 16) or not cfg.get("tie_word_embeddings", True):
        return None  # unusual shapes: the meta device counts them
    attention, final = 4 * (d * d + d), 2 * d if cfg.get("add_final_layer_norm", False) else 0
    ff = 2 * d * f_enc + f_enc + d
    stack = (pos + 2) * d + 2 * d + final
    enc_layers, dec_layers = n_enc * (attention + ff + 4 * d), n_dec * (2 * attention + ff + 6 * d)
    encoder, decoder = stack + enc_layers, stack + dec_layers
    return dict(embedding_params=vocab * d, head_params=0, other_params=encoder + decoder, tied_embeddings=True,
                num_layers=n_enc + n_dec, hidden_size=d, num_attention_heads=heads, num_kv_heads=heads,
                head_dim=d // heads, intermediate_size=f_enc, vocab_size=vocab, gated_mlp=False,
                max_position_embeddings=pos, learned_positions=True,
                encdec=EncDecFacts(num_encoder_layers=n_enc, num_decoder_layers=n_dec,
                                   activation=str(cfg.get("activation_function", "gelu")), gated=False, kind="bart",
                                   activation_dropout=bool(cfg.get("activation_dropout", 0.0)),
                                   encoder_params=enc_layers, decoder_params=dec_layers,
                                   cross_kv_params=n_dec * 2 * (d * d + d)))


def mamba_parts(cfg: dict, architecture: str | None) -> dict | None:
    """MambaForCausalLM (Mamba-1): embeddings; per block an RMSNorm and the mixer: in_proj (h -> 2
    d_inner), a depthwise conv1d (d_inner x kernel, bias), x_proj (d_inner -> dt_rank + 2 state),
    dt_proj (dt_rank -> d_inner, with bias), A_log (d_inner x state), D (d_inner), out_proj; a final
    RMSNorm; the head tied unless the config says otherwise."""
    if architecture not in (None, "MambaForCausalLM"):
        return None
    h = _get(cfg, "hidden_size", default=768)
    expand = cfg.get("expand", 2)
    inner = _get(cfg, "intermediate_size") or (int(expand * h) if _whole(h) and isinstance(expand, (int, float)) else None)
    state, kernel = cfg.get("state_size", 16), cfg.get("conv_kernel", 4)
    rank = cfg.get("time_step_rank", "auto")
    if not _whole(h, inner, state, kernel) or not (rank == "auto" or _whole(rank)):
        return None
    rank = math.ceil(h / 16) if rank == "auto" else rank
    bias, conv_bias = config_flag(cfg, "use_bias", False), config_flag(cfg, "use_conv_bias", True)
    vocab, n_layers = _get(cfg, "vocab_size", default=50280), _get(cfg, "num_layers", default=32)
    if not _whole(vocab, n_layers):
        return None
    mixer = h * 2 * inner + 2 * inner * bias + inner * kernel + inner * conv_bias
    mixer += inner * (rank + 2 * state) + rank * inner + inner + inner * state + inner + inner * h + h * bias
    tied = config_flag(cfg, "tie_word_embeddings", True)
    return dict(embedding_params=vocab * h, layer_params=mixer + h, head_params=0 if tied else vocab * h,
                other_params=h, tied_embeddings=tied, num_layers=n_layers, hidden_size=h,
                intermediate_size=inner, vocab_size=vocab,
                ssm=SsmFacts(state_size=state, conv_kernel=kernel, time_step_rank=rank))


def qwen_vl_vision_params(vision: dict) -> int:
    """Qwen2.5-VL's vision tower (``Qwen2_5_VisionTransformerPretrainedModel``): a Conv3d patch embedding
    without bias (channels x temporal x patch x patch -> width), blocks of two RMSNorms, fused qkv and
    proj with biases, a gated MLP with biases, and the patch merger (RMSNorm, then two Linear layers
    with biases: 4 x width -> 4 x width -> the language model's width)."""
    width, inter = vision.get("hidden_size", 1280), vision.get("intermediate_size", 3420)
    patch, temporal = vision.get("patch_size", 14), vision.get("temporal_patch_size", 2)
    channels, merge = vision.get("in_chans", vision.get("in_channels", 3)), vision.get("spatial_merge_size", 2)
    out = vision.get("out_hidden_size", 3584)
    block = 2 * width + (3 * width * width + 3 * width) + (width * width + width) + 3 * width * inter + 2 * inter + width
    merged = width * merge * merge
    merger = width + (merged * merged + merged) + (merged * out + out)
    return channels * temporal * patch * patch * width + vision.get("depth", 32) * block + merger


def qwen2_vl_vision_params(vision: dict) -> int:
    """Qwen2-VL's vision tower (``Qwen2VisionTransformerPretrainedModel``, modeling_qwen2_vl.py): a Conv3d
    patch embedding without bias, blocks of two LayerNorms (weight and bias), fused qkv and proj with
    biases and an fc1 / fc2 MLP with biases (width x mlp_ratio), and the patch merger (LayerNorm, then
    two Linear layers with biases: 4 x width -> 4 x width -> ``hidden_size``, the language model's width).
    The vision config's ``embed_dim`` is the tower's width, its ``hidden_size`` the merger's output."""
    width, out = vision.get("embed_dim", 1280), vision.get("hidden_size", 3584)
    inter = int(width * vision.get("mlp_ratio", 4))
    patch, temporal = vision.get("patch_size", 14), vision.get("temporal_patch_size", 2)
    channels, merge = vision.get("in_channels", vision.get("in_chans", 3)), vision.get("spatial_merge_size", 2)
    block = 2 * 2 * width + (3 * width * width + 3 * width) + (width * width + width) + 2 * width * inter + inter + width
    merged = width * merge * merge
    merger = 2 * width + (merged * merged + merged) + (merged * out + out)
    return channels * temporal * patch * patch * width + vision.get("depth", 32) * block + merger


def qwen2_vl_vision_facts(vision: dict) -> VisionFacts:
    """The same keys and defaults as ``qwen2_vl_vision_params``."""
    width, patch, temporal = vision.get("embed_dim", 1280), vision.get("patch_size", 14), vision.get("temporal_patch_size", 2)
    return VisionFacts(depth=vision.get("depth", 32), width=width, num_heads=vision.get("num_heads", 16),
                       intermediate_size=int(width * vision.get("mlp_ratio", 4)),
                       patch_values=vision.get("in_channels", vision.get("in_chans", 3)) * temporal * patch * patch,
                       merge=vision.get("spatial_merge_size", 2), kind="qwen2_vl")
