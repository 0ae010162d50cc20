"""Building the model the simulators train: its config, its tensors (fake or real, on the CPU), which
of its parameters train (PEFT's adapters for LoRA), and the optimizer that steps them.

What belongs here: turning a model name into a ``config.json`` dict, building the Hugging Face model
from it on the meta device (``advisor.model.meta.build_meta_model``), then giving every parameter and
buffer storage on the simulation device, under a ``FakeTensorMode`` (no memory) or for real (small
models, to validate the fake run). What does not: the CPU stand-ins (``advisor.simulate.fake_env``),
wrapping and the training step (``advisor.simulate.step``), measuring (``advisor.simulate.measure``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from advisor.model.attention_support import runs_eager_by_default
from advisor.model.config_keys import CONFIG_KEYS, config_value
from advisor.model.sources import resolve
from advisor.training import TrainingConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

# Attention-dropout keys of the supported families. CUDA's flash / memory-efficient SDPA kernels
# draw the dropout mask inside the kernel and save only an RNG seed and offset
# (aten/src/ATen/native/transformers/cuda/attention.cu), so attention dropout costs no memory on a
# GPU. The CPU SDPA (``_fused_sdp_choice_cpp``) has no dropout in its flash kernel and falls back to
# the math path, which saves the s x s probabilities and mask. The simulator therefore trains SDPA with
# attention dropout 0, which is what a GPU's memory looks like either way. Eager attention drops the
# probabilities out with ``F.dropout`` on a GPU too (transformers' ``eager_attention_forward``), which saves
# the bool mask and the dropped-out probabilities (``fake_env.cuda_dropout`` runs CUDA's native_dropout): it
# keeps the config's attention dropout (BERT's 0.1, GPT-2's).
ATTENTION_DROPOUT_KEYS = CONFIG_KEYS["attention_dropout"]


def resolve_config(model: str | dict) -> tuple[str, dict]:
    """``(name, config dict)`` for a bundled id, a local directory / config.json, a Hub id or a
    config dict, through the one resolver (``advisor.model.sources.resolve``)."""
    spec, cfg = resolve(model)
    if cfg is None:
        raise ValueError(f"cannot simulate '{spec.name[:40]}': a bare size has no architecture; "
                         "pass a model id, a local directory with config.json, or a config dict")
    return spec.name, cfg


def simulation_config(cfg: dict, *, attention: str, use_cache: bool = False) -> dict:
    """The config the simulator builds: no attention dropout under SDPA (see above), no KV cache unless
    ``use_cache`` (``TrainingConfig.use_cache``: a stack that leaves it on, ``advisor.estimate.kv_cache``)."""
    out = {k: v for k, v in cfg.items() if not k.startswith("_advisor")}
    out["use_cache"] = use_cache
    if config_value(cfg, "num_attention_heads") is not None:  # Mamba has no attention: transformers rejects one
        out["attn_implementation"] = runs_attention(cfg, attention)
    if out.get("attn_implementation") != "eager":
        for key in ATTENTION_DROPOUT_KEYS:  # set even when absent: the families default them to 0.1
            out[key] = 0.0
    return out


def runs_attention(cfg: dict, attention: str) -> str:
    """The attention the model runs when ``attention`` is asked for: eager where its transformers class has no
    SDPA path (profiles/attention_support.json, the planner's table: BLOOM, MPT), which is what
    ``from_pretrained`` falls back to, and what building the class with SDPA refuses."""
    archs = cfg.get("architectures") or []
    architecture = archs[0] if archs and isinstance(archs[0], str) else None
    return "eager" if attention == "sdpa" and runs_eager_by_default(architecture) else attention


def training_dtypes(training: TrainingConfig) -> tuple[Any, Any]:
    """``materialize``'s ``(dtype, frozen_dtype)`` for a training configuration: pure bf16 makes every weight bf16
    (the recipe's ``model.to``), except where the stack never casts the model and PEFT's adapters stay fp32
    (``TrainingConfig.fp32_adapters``: the frozen base bf16 alone); a LoRA base held in the compute dtype under mixed
    precision (``TrainingConfig.low_precision_base``) makes the frozen weights that dtype, the adapters fp32."""
    import torch

    if training.fp32_adapters:
        return None, torch.bfloat16
    frozen = getattr(torch, training.precision_info.compute_dtype) if training.low_precision_base else None
    return (torch.bfloat16 if training.precision == "bf16" else None), frozen


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


def net_vocab(cfg: dict) -> int:
    """The vocabulary the simulated batches draw token ids from (1000 for a config without one)."""
    return cfg.get("vocab_size") or 1000


def unique_params(net: Any) -> list:
    """``net``'s parameters, a shared (tied) tensor once."""
    return list(dict.fromkeys(net.parameters()))


def meta_model(cfg: dict, training: TrainingConfig) -> Any:
    """The model on the meta device, with PEFT's adapters when LoRA is asked for. Built outside the
    fake mode: PEFT creates each adapter on the CPU and moves it to its base layer's device, a swap
    that fake mode refuses."""
    from advisor.model.meta import build_meta_model

    from wrappers.losses import use_loss_kernel

    net = build_meta_model(simulation_config(cfg, attention=training.attention, use_cache=training.keeps_kv_cache))
    # before PEFT: the adapters wrap the model, not its forward; a stack's own chunked loss as its recipe makes the logits
    use_loss_kernel(net, training.loss, logits_first=training.recipe.chunked_logits == "model",
                    checkpointed=training.recipe.chunked_logits == "checkpointed")
    return net if training.lora is None else _with_lora(net, cfg, training.lora)


def _with_lora(net: Any, cfg: dict, lora: Any) -> Any:
    """PEFT's own adapters on the meta-device model (PEFT freezes the base); the PeftModel's inner
    model is returned, which is what a training script's forward runs."""
    try:
        import peft
    except ImportError:
        raise ValueError("simulating --lora needs PEFT: pip install peft") from None
    from advisor.model.lora import default_targets
    from advisor.model.sources import spec_from_config

    spec = spec_from_config(cfg, name=str(cfg.get("_name_or_path", "model")), source="local")
    wrapped = peft.get_peft_model(net, peft.LoraConfig(**lora.peft_kwargs(
        () if lora.targets else default_targets(spec))))
    return wrapped.base_model.model


# torch.optim's flags for each implementation (torch/optim/adam.py: fused=True runs _fused_adam,
# foreach=True _multi_tensor_adam, foreach=False _single_tensor_adam).
OPTIMIZER_FLAGS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}


SIMULATED_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor")  # what build_optimizer builds


def build_optimizer(params: list, training: TrainingConfig) -> Any:
    """The recipe's optimizer over ``params`` in its implementation (``training.optimizer_implementation``),
    as on a GPU; ``ValueError`` for an optimizer the simulators do not run."""
    import torch

    flags = OPTIMIZER_FLAGS[training.optimizer_implementation]
    if training.optimizer in ("adamw", "adam"):
        cls = torch.optim.AdamW if training.optimizer == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-4, **flags)
    if training.optimizer in ("sgd", "sgd-momentum"):
        momentum = 0.9 if training.optimizer == "sgd-momentum" else 0.0
        return torch.optim.SGD(params, lr=1e-4, momentum=momentum, **flags)
    if training.optimizer == "adafactor":  # transformers' Adafactor as the Trainer's optim="adafactor" builds it
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False)
    raise ValueError(f"simulate runs {', '.join(SIMULATED_OPTIMIZERS)}, not '{training.optimizer}'")
