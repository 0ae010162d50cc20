"""The linear layers of the bundled families whose blocks are not Llama-like (T5, BART, Mamba, Jamba,
DeepSeek, Qwen-VL), listed from the spec's shape fields as the meta-device recording
(``advisor.simulate.linears``) lists them: qualified names in module order, shapes, the output head.
LoRA counts its adapters from them with PEFT's matching rules (``advisor.model.lora``). Pure, no torch.

What belongs here: the module trees of transformers 5.x ``modeling_t5.py`` (``encoder.block.i.layer.0.
SelfAttention.q``, ``DenseReluDense.wi`` / ``wi_0``, ``wi_1``, ``wo``; the decoder's ``EncDecAttention``),
``modeling_bart.py`` (``self_attn`` / ``encoder_attn`` ``k_proj, v_proj, q_proj, out_proj``, ``fc1``,
``fc2``), ``modeling_mamba.py`` (``mixer.in_proj, x_proj, dt_proj, out_proj``), ``modeling_jamba.py``
(attention or ``mamba`` mixer, a dense ``feed_forward`` or the MoE block, whose router and stacked
experts are not ``nn.Linear``), ``modeling_deepseek_v3.py`` (MLA's ``q_a_proj, q_b_proj,
kv_a_proj_with_mqa, kv_b_proj, o_proj``; dense ``mlp`` or ``mlp.shared_experts``) and
``modeling_qwen2_5_vl.py`` (the vision tower's ``attn.qkv, attn.proj``, its MLP, the merger's ``mlp.0,
mlp.2``). Each is checked name for name against the model built on the meta device
(``tests/model/test_kind_linears.py``). The language model's layers come first, so a layout's first
block (``LinearLayout.first_block``) is a text block.
"""

from __future__ import annotations

import functools

from advisor.model.bundled import load_architectures, load_peft_expert_targets
from advisor.model.linear_layout import LinearLayer, LinearLayout
from advisor.model.spec import ModelSpec

_Shapes = list[tuple[str, int, int]]


def _attention(prefix: str, names: tuple[str, str, str, str], h: int, q_out: int, kv_out: int) -> _Shapes:
    q, k, v, o = names
    shapes = {q: (h, q_out), k: (h, kv_out), v: (h, kv_out), o: (q_out, h)}
    return [(f"{prefix}.{name}", *shapes[name]) for name in names]


def _t5(spec: ModelSpec) -> _Shapes:
    d, inner, ff, encdec = spec.hidden_size, spec.num_attention_heads * spec.head_dim, spec.intermediate_size, spec.encdec
    mlp = (("wi_0", d, ff), ("wi_1", d, ff)) if encdec.gated else (("wi", d, ff),)
    mlp += (("wo", ff, d),)
    qkvo = ("q", "k", "v", "o")
    layers: _Shapes = []
    for stack, n, attentions in (("encoder", encdec.num_encoder_layers, ("SelfAttention",)),
                                 ("decoder", encdec.num_decoder_layers, ("SelfAttention", "EncDecAttention"))):
        for i in range(n):
            for j, kind in enumerate(attentions):
                layers += _attention(f"{stack}.block.{i}.layer.{j}.{kind}", qkvo, d, inner, inner)
            layers += [(f"{stack}.block.{i}.layer.{len(attentions)}.DenseReluDense.{name}", a, b) for name, a, b in mlp]
    return layers


def _bart(spec: ModelSpec) -> _Shapes:
    d, ff, encdec = spec.hidden_size, spec.intermediate_size, spec.encdec
    names = ("k_proj", "v_proj", "q_proj", "out_proj")
    layers: _Shapes = []
    for stack, n, attentions in (("encoder", encdec.num_encoder_layers, ("self_attn",)),
                                 ("decoder", encdec.num_decoder_layers, ("self_attn", "encoder_attn"))):
        for i in range(n):
            prefix = f"model.{stack}.layers.{i}"
            for kind in attentions:
                layers += _attention(f"{prefix}.{kind}", names, d, d, d)
            layers += [(f"{prefix}.fc1", d, ff), (f"{prefix}.fc2", ff, d)]
    return layers


def _mamba_mixer(prefix: str, h: int, inner: int, ssm) -> _Shapes:
    rank, state = ssm.time_step_rank, ssm.state_size
    return [(f"{prefix}.in_proj", h, 2 * inner), (f"{prefix}.x_proj", inner, rank + 2 * state),
            (f"{prefix}.dt_proj", rank, inner), (f"{prefix}.out_proj", inner, h)]


def _mamba(spec: ModelSpec) -> _Shapes:
    return [layer for i in range(spec.num_layers)
            for layer in _mamba_mixer(f"backbone.layers.{i}.mixer", spec.hidden_size, spec.intermediate_size, spec.ssm)]


def _gated_mlp(prefix: str, h: int, inter: int) -> _Shapes:
    return [(f"{prefix}.gate_proj", h, inter), (f"{prefix}.up_proj", h, inter), (f"{prefix}.down_proj", inter, h)]


def _jamba(spec: ModelSpec) -> _Shapes:
    h, hybrid = spec.hidden_size, spec.hybrid
    q_out, kv_out = spec.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    layers: _Shapes = []
    for i, (attention, experts) in enumerate(zip(hybrid.attention_layers, hybrid.expert_layers)):
        prefix = f"model.layers.{i}"
        layers += (_attention(f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"), h, q_out, kv_out)
                   if attention else _mamba_mixer(f"{prefix}.mamba", h, hybrid.mamba_inner, hybrid.ssm))
        if not experts:  # the MoE block's router and experts are parameters, not nn.Linear
            layers += _gated_mlp(f"{prefix}.feed_forward", h, spec.intermediate_size)
    return layers


def _deepseek(spec: ModelSpec) -> _Shapes:
    h, heads, mla, moe = spec.hidden_size, spec.num_attention_heads, spec.mla, spec.moe
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    layers: _Shapes = []
    for i in range(spec.num_layers):
        prefix = f"model.layers.{i}"
        if mla.q_lora_rank is None:
            layers.append((f"{prefix}.self_attn.q_proj", h, heads * qk))
        else:
            layers += [(f"{prefix}.self_attn.q_a_proj", h, mla.q_lora_rank),
                       (f"{prefix}.self_attn.q_b_proj", mla.q_lora_rank, heads * qk)]
        layers += [(f"{prefix}.self_attn.kv_a_proj_with_mqa", h, mla.kv_lora_rank + mla.qk_rope_head_dim),
                   (f"{prefix}.self_attn.kv_b_proj", mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim)),
                   (f"{prefix}.self_attn.o_proj", heads * mla.v_head_dim, h)]
        if i < moe.num_dense_layers:  # first_k_dense_replace: the first layers are dense
            layers += _gated_mlp(f"{prefix}.mlp", h, moe.dense_intermediate_size)
        elif moe.shared_intermediate_size:
            layers += _gated_mlp(f"{prefix}.mlp.shared_experts", h, moe.shared_intermediate_size)
    return layers


def _qwen_vl(spec: ModelSpec) -> _Shapes:
    h, tower = spec.hidden_size, spec.vision
    q_out, kv_out = spec.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    layers: _Shapes = []
    for i in range(spec.num_layers):
        prefix = f"model.language_model.layers.{i}"
        layers += _attention(f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"), h, q_out, kv_out)
        layers += _gated_mlp(f"{prefix}.mlp", h, spec.intermediate_size)
    w, inter = tower.width, tower.intermediate_size
    for i in range(tower.depth):
        prefix = f"model.visual.blocks.{i}"
        layers += [(f"{prefix}.attn.qkv", w, 3 * w), (f"{prefix}.attn.proj", w, w)]
        layers += (_gated_mlp(f"{prefix}.mlp", w, inter) if tower.kind == "qwen2_5_vl"
                   else [(f"{prefix}.mlp.fc1", w, inter), (f"{prefix}.mlp.fc2", inter, w)])
    merged = w * tower.merge * tower.merge
    return layers + [("model.visual.merger.mlp.0", merged, merged), ("model.visual.merger.mlp.2", merged, h)]


_KINDS = {"t5": _t5, "bart": _bart, "mamba": _mamba, "jamba": _jamba, "deepseek": _deepseek, "qwen_vl": _qwen_vl}


@functools.lru_cache(maxsize=16)
def formula_layout(spec: ModelSpec) -> LinearLayout | None:
    """``spec``'s linear layers when its family is one of the kinds above and its shape fields are known;
    None otherwise (a Llama-like decoder, GPT-2, BERT, Llava: ``advisor.model.lora.block_linears``)."""
    info = load_architectures().get(spec.model_type or "")
    build = _KINDS.get(info.formula) if info is not None else None
    if build is None or None in (spec.hidden_size, spec.num_layers, spec.vocab_size):
        return None
    try:
        shapes = build(spec)
    except (AttributeError, TypeError):  # a facts field this kind needs is missing (a hand-built spec)
        return None
    layers = tuple(LinearLayer(name=name, in_features=fan_in, out_features=fan_out) for name, fan_in, fan_out in shapes)
    head = LinearLayer(name="lm_head", in_features=spec.hidden_size, out_features=spec.vocab_size)
    # PEFT's all-linear also adapts the stacked expert weights of the model types it maps them for
    # (DeepSeek); Jamba's it leaves alone (not in peft 0.21's conversion table: every nn.Linear but the head).
    stacked = spec.model_type in load_peft_expert_targets() and spec.num_experts is not None
    return LinearLayout(layers=(*layers, head), output="lm_head", stacked_experts=stacked)
