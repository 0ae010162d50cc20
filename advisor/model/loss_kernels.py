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
# _logit_transform order: a truthy soft-cap, a scale other than 1.
TRANSFORM_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class LossKernelFacts(BaseModel):
    """One ``model_type``'s row of ``profiles/loss_kernels.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    causal_lm_class: str = Field(description="The *ForCausalLM class the kernel would go on.")
    head_ok: bool = Field(description="The class has .model and a bias-free nn.Linear .lm_head.")
    final_logit_softcapping: float | None = Field(default=None, description="Config-class default soft-cap.")
    logit_scale: float | None = Field(default=None, description="Config-class default logit scale (Cohere).")
    logits_scaling: float | None = Field(default=None, description="Config-class default logit divisor (Granite).")


@functools.cache
def load_loss_kernel_facts() -> dict[str, LossKernelFacts]:
    raw = json.loads((PROFILES_DIR / "loss_kernels.json").read_text())["families"]
    return {k: LossKernelFacts(**v) for k, v in raw.items()}


def loss_kernel_refusal(cfg: dict) -> str | None:
    """Why ``use_loss_kernel`` refuses the causal LM of ``cfg``, worded as it words it after
    ``loss kernel '<kernel>'`` (less its closing "use loss='hf'"); None when it accepts it."""
    model_type = cfg.get("model_type")
    facts = load_loss_kernel_facts().get(model_type) if isinstance(model_type, str) else None
    names = cfg.get("architectures")
    name = facts.causal_lm_class if facts else (names[0] if isinstance(names, list) and names and
                                                 isinstance(names[0], str) else str(model_type))
    if facts is not None and not facts.head_ok:
        return f"needs a causal LM with .model and a bias-free .lm_head; {name} has none"
    found = []
    for key in TRANSFORM_KEYS:
        value = cfg[key] if key in cfg else getattr(facts, key, None)
        if key == "final_logit_softcapping" and value:
            found.append(f"{key}={value}")
        elif key != "final_logit_softcapping" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value != 1:
            found.append(f"{key}={value}")
    if found:
        return (f"computes the loss on the head's raw output; {name} transforms its logits first "
                f"({', '.join(found)})")
    return None
