"""Whether ``wrappers.losses.use_loss_kernel`` can run ``--loss chunked|fused`` on a model, from its
config alone (``profiles/loss_kernels.json``): the planner refuses a pinned kernel the model cannot run
and leaves such kernels out of its remedies and loss notes. The live check stays in ``wrappers.losses``;
tests/model/test_loss_kernels.py holds the two together. No torch.
"""

from __future__ import annotations

import functools
import json

from pydantic import BaseModel, ConfigDict, Field

from profiles import PROFILES_DIR

# The config keys through which a model changes its logits before the loss, in wrappers.losses'
# _logit_transform order (its SOFT_CAP_KEYS, then SCALE_KEYS): a truthy soft-cap, a scale other than 1.
SOFT_CAP_KEYS = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
SCALE_KEYS = ("logit_scale", "logits_scaling", "lm_head_multiplier")
TRANSFORM_KEYS = SOFT_CAP_KEYS + SCALE_KEYS
# What the kernels need, as wrappers.losses.HEAD_SHAPE words it.
HEAD_SHAPE = "whose loss is transformers' loss_function over a plain nn.Linear head on its decoder's output"
# Why the fused kernel refuses a head PEFT adapts (LoRA on lm_head): PEFT's layer's ``weight`` is its base layer's,
# so a kernel that reads the weight (not the module) drops the adapter; the chunked kernel calls the module.
# Why the kernels refuse an MoE causal LM that records its routers' logits and adds their loss otherwise than
# Mixtral's forward (``router_aux_loss_types``).
ROUTER_AUX = ("does not add the routers' auxiliary loss as {name}'s forward does (output_router_logits is on; "
              "with it off the model trains without that loss)")
HEAD_ADAPTER = "reads the head's weight, not its module, and would drop the PEFT adapter on the head (lm_head)"


class LossKernelFacts(BaseModel):
    """One ``model_type``'s row of ``profiles/loss_kernels.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    causal_lm_class: str = Field(description="The *ForCausalLM class the kernel would go on.")
    head_ok: bool = Field(description="The class's forward hands an nn.Linear head's output over its decoder's "
                                      "last hidden state to transformers' loss_function (wrappers.losses).")
    final_logit_softcapping: float | None = Field(default=None, description="Config-class default soft-cap.")
    logits_soft_cap: float | None = Field(default=None, description="Config-class default soft-cap "
                                                                     "(RecurrentGemma).")
    output_logit_soft_cap: float | None = Field(default=None, description="Config-class default soft-cap (xLSTM).")
    logit_scale: float | None = Field(default=None, description="Config-class default logit scale (Cohere).")
    logits_scaling: float | None = Field(default=None, description="Config-class default logit divisor (Granite).")
    lm_head_multiplier: float | None = Field(default=None, description="Config-class default logit multiplier "
                                                                        "(Falcon-H1).")


@functools.cache
def router_aux_loss_types() -> frozenset[str]:
    """The model_types whose forward adds the routers' auxiliary loss as the kernels repeat it
    (``profiles/loss_kernels.json`` ``router_aux_loss``)."""
    return frozenset(json.loads((PROFILES_DIR / "loss_kernels.json").read_text())["router_aux_loss"]["model_types"])


@functools.cache
def load_loss_kernel_facts() -> dict[str, LossKernelFacts]:
    raw = json.loads((PROFILES_DIR / "loss_kernels.json").read_text())["families"]
    return {k: LossKernelFacts(**v) for k, v in raw.items()}


TRANSFORMS_LOGITS = "computes the loss on the head's raw output"  # how loss_kernel_refusal's transform reason begins


def loss_kernel_refusal(cfg: dict) -> str | None:
    """Why ``use_loss_kernel`` refuses the causal LM of ``cfg``, worded as it words it after
    ``loss kernel '<kernel>'`` (less its closing "use loss='hf'"); None when it accepts it."""
    model_type = cfg.get("model_type")
    facts = load_loss_kernel_facts().get(model_type) if isinstance(model_type, str) else None
    names = cfg.get("architectures")
    name = facts.causal_lm_class if facts else (names[0] if isinstance(names, list) and names and
                                                 isinstance(names[0], str) else str(model_type))
    if facts is not None and not facts.head_ok:
        return f"needs a causal LM {HEAD_SHAPE}; {name} is not one"
    found = []
    for key in TRANSFORM_KEYS:
        value = cfg[key] if key in cfg else getattr(facts, key, None)
        if key in SOFT_CAP_KEYS and value:
            found.append(f"{key}={value}")
        elif key in SCALE_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value != 1:
            found.append(f"{key}={value}")
    if found:
        return (f"{TRANSFORMS_LOGITS}; {name} transforms its logits first "
                f"({', '.join(found)})")
    if cfg.get("output_router_logits") and model_type not in router_aux_loss_types():
        return ROUTER_AUX.format(name=name)
    return None
