"""PEFT's ``modules_to_save``: a trainable full copy of each named module beside the adapters.

PEFT wraps every module whose qualified name ends with one of the names (``peft.utils.other.
_set_trainable``: ``key.endswith(target_key)`` over ``named_modules(remove_duplicate=False)``, a plain
string suffix) in a ``ModulesToSaveWrapper``, which keeps the original module frozen and trains a deep
copy (``ModulesToSaveWrapper.update``: ``copy.deepcopy(self.original_module)``). So each matched module
adds its parameters once more to the model, all of them trainable (gradients and optimizer state): a
tied ``lm_head`` or ``embed_tokens`` is copied whole, the copy no longer tied (``ensure_weight_tying``
is off by default in PEFT 0.21). Checked against PEFT's ``get_nb_trainable_parameters`` on the meta
device in ``tests/model/test_saved_modules.py``.

Modelled for the Llama-like decoders (the ``decoder`` formula: transformers' ``LlamaForCausalLM`` and
kin, ``model.embed_tokens``, ``model.layers.N``, ``model.norm``, ``lm_head``, or a task head's
``score`` / ``qa_outputs``, ``advisor.model.heads``, whose base model some question-answering classes call
``transformer``) and for the modules outside the blocks: a name
matching a module inside a block (a whole block, a norm or a linear layer of one) is refused, since
its copy would sit in every block the estimate places as one. For BERT only its task head (``classifier``,
``qa_outputs``: what PEFT's task models save) is offered. No torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.model.bundled import load_architectures

if TYPE_CHECKING:  # pragma: no cover
    from advisor.model.lora import LoraConfig
    from advisor.model.spec import ModelSpec

# Modules of one Llama-like block by their name under model.layers.N (transformers' LlamaDecoderLayer,
# LlamaAttention, LlamaMLP; Qwen3's q_norm / k_norm; Phi-3's fused projections; Gemma 2's sandwich norms).
_ATTENTION = ("self_attn", "self_attn.o_proj")
_PROJECTIONS = {False: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
                True: ("self_attn.qkv_proj", "mlp.gate_up_proj")}
_MLP_AND_NORMS = ("mlp", "mlp.down_proj", "mlp.act_fn", "input_layernorm", "post_attention_layernorm")
_QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
_SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def outside_modules(spec: "ModelSpec") -> dict[str, int]:
    """The modules outside the blocks by qualified name, with their parameters (decoders only)."""
    info = load_architectures().get(spec.model_type or "")
    if info is not None and info.formula == "bert" and spec.head is not None:
        return {spec.head.module: spec.head_params}  # BERT's task head, which PEFT's task models save; nothing else
    if info is None or info.formula != "decoder" or None in (spec.embedding_params, spec.hidden_size,
                                                             spec.vocab_size, spec.head_params):
        raise ValueError(f"--lora-modules-to-save is modelled for Llama-like decoders; {spec.name[:60]} "
                         f"({spec.model_type or 'size only'}) is not one")
    head = {spec.head.module: spec.head_params} if spec.head is not None else {
        "lm_head": spec.vocab_size * spec.hidden_size}
    base = _prefix(spec)
    return {f"{base}.embed_tokens": spec.embedding_params, f"{base}.norm": spec.hidden_size, **head}


def _prefix(spec: "ModelSpec") -> str:
    return spec.head.base_prefix if spec.head is not None else "model"


def _inside_keys(spec: "ModelSpec") -> list[str]:
    """Qualified names of the modules inside the blocks, and of the containers above them (the base model,
    its layer list, its rotary embedding: no parameter of its own)."""
    info = load_architectures()[spec.model_type]
    if info.formula != "decoder":  # BERT: only its task head is offered (outside_modules)
        return []
    names = ("", *_ATTENTION, *_PROJECTIONS[info.fused_projections], *_MLP_AND_NORMS,
             *(_QK_NORMS if info.qk_norm else ()), *(_SANDWICH_NORMS if info.norms_per_layer == 4 else ()))
    base = _prefix(spec)
    return [f"{base}.layers.{i}" + (f".{name}" if name else "") for i in range(spec.num_layers or 1)
            for name in names] + [base, f"{base}.layers", f"{base}.rotary_emb"]


def saved_modules(spec: "ModelSpec", names: tuple[str, ...]) -> dict[str, int]:
    """``{qualified name: parameters}`` of the modules PEFT copies for ``names``. ValueError naming a
    name that matches no module, or one inside the blocks (not modelled)."""
    outside = outside_modules(spec)
    inside = _inside_keys(spec)
    matched: dict[str, int] = {}
    for name in names:
        found = [key for key in outside if key.endswith(name)]
        inner = [key for key in inside if key.endswith(name)]
        if inner:
            raise ValueError(f"--lora-modules-to-save {name}: it matches {inner[0]} (inside the blocks or the whole "
                             f"model), which is not modelled; name some of: {', '.join(outside)}")
        if not found:
            raise ValueError(f"--lora-modules-to-save {name}: no module of {spec.name[:60]} ends with it; its modules "
                             f"outside the blocks are: {', '.join(outside)}")
        matched.update({key: outside[key] for key in found})
    return matched


def saved_module_params(spec: "ModelSpec", lora: "LoraConfig") -> int:
    """Parameters of PEFT's trainable copies for ``lora.modules_to_save`` (0 when none)."""
    if not lora.modules_to_save:
        return 0
    return sum(saved_modules(spec, lora.modules_to_save).values())


# Module names TRL's peft_module_casting_to_bf16 casts to bf16 (trl/trainer/utils.py: 'lm_head', 'embed_tokens', 'wte',
# 'wpe' in the qualified name): the frozen originals and PEFT's trainable copies alike.
CAST_TO_COMPUTE = ("lm_head", "embed_tokens", "wte", "wpe")


def compute_dtype_copies(spec: "ModelSpec", lora: "LoraConfig") -> int:
    """Parameters of the modules_to_save copies whose names TRL casts to the compute dtype (``CAST_TO_COMPUTE``)."""
    if not lora.modules_to_save:
        return 0
    return sum(n for name, n in saved_modules(spec, lora.modules_to_save).items()
               if any(part in name for part in CAST_TO_COMPUTE))


def head_frozen(spec: "ModelSpec", lora: "LoraConfig | None") -> bool:
    """The output head gets no weight gradient: a LoRA model's frozen base, unless PEFT trains a copy of the
    head (``modules_to_save`` naming it; ``ModulesToSaveWrapper.weight`` is the trained copy's, which the fused
    loss kernel reads)."""
    if lora is None:
        return False
    head = spec.head.module if spec.head is not None else "lm_head"
    return not any(head.endswith(name) for name in lora.modules_to_save or ())  # PEFT: key.endswith(name)


def saved_modules_note(spec: "ModelSpec", lora: "LoraConfig") -> str:
    """The plan's assumption line for ``modules_to_save``: what is copied and what of it is modelled."""
    saved = saved_modules(spec, lora.modules_to_save or ())
    listed = ", ".join(f"{name} ({count:,})" for name, count in saved.items())
    head = spec.head.module if spec.head is not None else "lm_head"
    unmodelled = [name for name in saved if not (head and name.endswith(head)) and saved[name] > spec.hidden_size]
    line = (f"PEFT modules_to_save: a trainable copy of each of {listed} beside its frozen original, with "
            "gradients and optimizer states")
    if head and any(name.endswith(head) for name in saved):
        line += f"; the {head} copy keeps its input for its weight gradient"
    if unmodelled:
        line += (f"; what training {', '.join(unmodelled)} adds to the activations (its input, a vocabulary-sized "
                 "gradient) is not modelled yet: counted as over a frozen base")
    return line
