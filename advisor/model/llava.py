"""Llava (``LlavaForConditionalGeneration``): exact parameter count and the vision facts its activation
model needs, from a ``config.json`` dict, without torch.

What belongs here: the module tree of transformers 5.x ``modeling_llava.py`` with a CLIP vision tower
(``modeling_clip.py``, ``CLIPVisionModel``) as arithmetic: the tower, the 2-layer MLP projector and
the language model (a pre-norm decoder counted by ``advisor.model.architectures``). Checked against
``sum(p.numel())`` of the model built on the meta device (``tests/model/test_llava_counts.py``).
The tower's activations: ``advisor.estimate.activations_vision``. Other towers (SigLIP, Pixtral) and
Llava-NeXT's tiling are not counted here: the meta device counts them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.model.bundled import load_architectures
from advisor.model.config_keys import config_flag


class ClipTowerFacts(BaseModel):
    """A Llava's CLIP vision tower and projector, as the activation model needs them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(ge=1, description="CLIP encoder layers built (all hold parameters).")
    used_layers: int = Field(ge=0, description="Layers whose output reaches the language model "
                             "(vision_feature_layer -2: all but the last; the last runs, its output unused).")
    width: int = Field(ge=1, description="Vision hidden size.")
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1, description="Vision MLP width.")
    activation: str = Field(description="Vision MLP activation (CLIP: quick_gelu).")
    patch_values: int = Field(ge=1, description="Pixel values per patch (channels x patch x patch).")
    tokens: int = Field(ge=2, description="Tower tokens per image: (image_size / patch)^2 patches + CLS.")
    image_tokens: int = Field(ge=1, description="Language-model tokens per image (strategy 'default' drops CLS).")
    projector_in: int = Field(ge=1, description="Projector input width (vision width x feature layers).")
    projector_out: int = Field(ge=1, description="Projector width (the language model's hidden size).")
    block_class: str = Field(default="CLIPEncoderLayer", description="The tower's block class (FSDP wrap unit).")
    output_keeps_tower: str | None = Field(default=None, description="The release ('transformers 5.24.0') whose "
                                           "Llava output keeps the tower's output, so the layers after the last "
                                           "used one stay saved while it is alive (profiles/library_releases.json, "
                                           "llava_output_keeps_vision_tower); None: they are freed.")

    @property
    def held_layers(self) -> int:
        """Layers whose saved tensors are alive at the end of the forward: the used ones, or all of them
        where the release's output keeps the tower's output."""
        return self.num_layers if self.output_keeps_tower else self.used_layers

    @property
    def projector_shares_feature(self) -> bool:
        """One feature layer: the projector's input is a view of that layer's output, not a concatenation
        (``advisor.estimate.activations_llava.clip_saved`` says when the storage is then shared)."""
        return self.projector_in == self.width


def _defaults(sub: str) -> dict:
    """Config-class defaults of a Llava sub-config (``profiles/architectures.json``, llava.config_defaults)."""
    info = load_architectures().get("llava")
    return dict((info.config_defaults or {}).get(sub, {})) if info is not None else {}


def _whole(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def clip_tower(cfg: dict, *, output_keeps_tower: str | None = None) -> tuple[int, ClipTowerFacts] | None:
    """(parameters of the tower and projector, their facts), or ``None`` for a tower other than CLIP's.

    CLIPVisionModel: embeddings (class token W, Conv2d patch embedding C x P x P -> W without bias,
    (patches + 1) x W learned positions), pre- and post-LayerNorm (weight and bias), layers of two
    LayerNorms, q, k, v, out projections with biases and fc1 / fc2 with biases. The projector:
    linear_1 (W x feature layers -> text width) and linear_2 (text width -> text width), with biases
    when ``multimodal_projector_bias`` (default true) (modeling_llava.py LlavaMultiModalProjector).
    ``output_keeps_tower``: the release in force whose output keeps the tower's (``ClipTowerFacts``)."""
    vision = {**_defaults("vision_config"), **(cfg.get("vision_config") or {})}
    text = {**_defaults("text_config"), **(cfg.get("text_config") or {})}
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        return None
    w, inter, n = vision.get("hidden_size"), vision.get("intermediate_size"), vision.get("num_hidden_layers")
    heads, patch, side = vision.get("num_attention_heads"), vision.get("patch_size"), vision.get("image_size")
    channels, out = vision.get("num_channels", 3), text.get("hidden_size")
    feature = cfg.get("vision_feature_layer", -2)
    layers = feature if isinstance(feature, list) else [feature]
    if not _whole(w, inter, n, heads, patch, side, channels, out) or not layers \
            or not all(isinstance(i, int) and -(n + 1) <= i <= n for i in layers):
        return None
    patches = (side // patch) ** 2
    embeddings = w + channels * patch * patch * w + (patches + 1) * w
    layer = 4 * (w * w + w) + (w * inter + inter) + (inter * w + w) + 2 * 2 * w
    tower = embeddings + 2 * 2 * w + n * layer
    bias = config_flag(cfg, "multimodal_projector_bias", True)
    feed = w * len(layers)
    projector = feed * out + out * bias + out * out + out * bias
    # hidden_states holds the embeddings and every layer's output (n + 1 entries): index i needs i layers.
    used = max(i if i >= 0 else n + 1 + i for i in layers)
    default = cfg.get("vision_feature_select_strategy", "default") == "default"
    facts = ClipTowerFacts(num_layers=n, used_layers=used, width=w, num_heads=heads, intermediate_size=inter,
                           activation=str(vision.get("hidden_act", "quick_gelu")),
                           patch_values=channels * patch * patch, tokens=patches + 1,
                           image_tokens=patches if default else patches + 1, projector_in=feed, projector_out=out,
                           output_keeps_tower=output_keeps_tower)
    return tower + projector, facts


def llava_text_config(cfg: dict) -> tuple[dict, str]:
    """The language model's config (its class defaults filled in for a Llama one) and its model_type."""
    text = cfg.get("text_config") or {}
    kind = text.get("model_type", "llama")
    merged = {**(_defaults("text_config") if kind == "llama" else {}), **text}
    if "tie_word_embeddings" in cfg:  # LlavaConfig's own flag decides whether lm_head is tied
        merged["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return merged, kind
