"""Building the model the simulator trains: its config, its tensors (fake or real, on the CPU) and
which of its parameters train.

What belongs here: turning a model name into a ``config.json`` dict, building the Hugging Face model
from it on the meta device (``advisor.model.meta.build_meta_model``), then giving every parameter and
buffer storage on the simulation device, under a ``FakeTensorMode`` (no memory) or for real (small
models, to validate the fake run). What does not: wrapping, the training step, measuring
(``advisor.simulate.step``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.model.config_keys import CONFIG_KEYS, config_value
from advisor.model.sources import resolve

if TYPE_CHECKING:  # pragma: no cover
    import torch

# Attention-dropout keys of the supported families. CUDA's flash / memory-efficient SDPA kernels
# draw the dropout mask inside the kernel and save only an RNG seed and offset
# (aten/src/ATen/native/transformers/cuda/attention.cu), so attention dropout costs no memory on a
# GPU. The CPU SDPA (``_fused_sdp_choice_cpp``) has no dropout in its flash kernel and falls back to
# the math path, which saves the s x s probabilities and mask. The simulator therefore trains with
# attention dropout 0, which is what a GPU's memory looks like either way.
ATTENTION_DROPOUT_KEYS = CONFIG_KEYS["attention_dropout"]


def resolve_config(model: str | dict) -> tuple[str, dict]:
    """``(name, config dict)`` for a bundled id, a local directory / config.json, a Hub id or a
    config dict, through the one resolver (``advisor.model.sources.resolve``)."""
    spec, cfg = resolve(model)
    if cfg is None:
        raise ValueError(f"cannot simulate '{spec.name[:40]}': a bare size has no architecture; "
                         "pass a model id, a local directory with config.json, or a config dict")
    return spec.name, cfg


def simulation_config(cfg: dict, *, attention: str) -> dict:
    """The config the simulator builds: no attention dropout (see above), no KV cache."""
    out = {k: v for k, v in cfg.items() if not k.startswith("_advisor")}
    for key in ATTENTION_DROPOUT_KEYS:  # set even when absent: the families default them to 0.1
        out[key] = 0.0
    out["use_cache"] = False
    if config_value(cfg, "num_attention_heads") is not None:  # Mamba has no attention: transformers rejects one
        out["attn_implementation"] = attention
    return out


def materialize(model: "torch.nn.Module", *, device: str, real: bool, dtype: "torch.dtype | None" = None,
                frozen_dtype: "torch.dtype | None" = None) -> None:
    """Give every meta parameter and buffer storage on ``device``, in place, keeping sharing (tied
    embeddings stay one tensor). Call it under a ``FakeTensorMode`` for fake tensors. Real tensors
    get small random values so that the step stays finite. ``dtype`` casts floating parameters
    (pure bf16: ``Module.to`` cannot swap fake parameters in place); ``frozen_dtype`` casts only the
    frozen ones (a LoRA base loaded in bf16, its adapters in fp32)."""
    import torch

    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in made:
                # From the shape, not empty_like: the meta model may come from outside the fake mode
                # (a PEFT model is built there), and fake mode takes no real tensor as an input.
                wanted = (frozen_dtype if not param.requires_grad else None) or dtype or param.dtype
                data = torch.empty(param.shape, device=device, dtype=wanted)
                if real:
                    torch.nn.init.normal_(data, std=0.02)
                made[id(param)] = torch.nn.Parameter(data, requires_grad=param.requires_grad)
            module._parameters[name] = made[id(param)]
        for name, buf in list(module._buffers.items()):
            if buf is None:
                continue
            if id(buf) not in made:
                data = torch.empty(buf.shape, device=device, dtype=buf.dtype)
                if real and data.is_floating_point():
                    data.fill_(1.0)  # RoPE inverse frequencies and the like: any finite value will do
                elif real:
                    data.zero_()
                made[id(buf)] = data
            module._buffers[name] = made[id(buf)]


def freeze_to(model: "torch.nn.Module", trainable_params: int | None) -> int:
    """Leave about ``trainable_params`` parameters trainable, spread over every block (LoRA-like:
    activations are kept in every layer). Whole tensors are kept, taken round-robin across the
    blocks, never exceeding the target. Returns the trainable count actually left."""
    params = list(dict.fromkeys(model.parameters()))  # shared tensors once
    total = sum(p.numel() for p in params)
    if trainable_params is None:  # as built: everything, or what PEFT left trainable
        return sum(p.numel() for p in params if p.requires_grad)
    if trainable_params >= total:
        return total
    from wrappers.blocks import find_blocks

    blocks = find_blocks(model)
    per_block = [list(b.parameters()) for b in blocks]
    order: list = []
    for index in range(max((len(b) for b in per_block), default=0)):
        order.extend(b[index] for b in per_block if index < len(b))
    in_blocks = {id(p) for p in order}
    order.extend(p for p in params if id(p) not in in_blocks)
    for p in params:
        p.requires_grad_(False)
    left = 0
    for p in sorted(order, key=lambda p: p.numel()):  # small tensors first: norms, then matrices
        if left + p.numel() <= trainable_params:
            p.requires_grad_(True)
            left += p.numel()
    return left
