"""Loss kernels for causal language models that do not materialise the full logits in fp32:
``chunked`` (the head and cross-entropy over sequence chunks) and ``fused`` (a fused linear +
cross-entropy that never keeps any logits, the algorithm of Liger-Kernel's
``LigerFusedLinearCrossEntropyLoss``: gradients are computed chunk by chunk in the forward and
handed back in the backward).

``use_loss_kernel(model, "chunked" | "fused")`` replaces a Hugging Face causal LM's forward (on the
instance) so that ``model(input_ids=..., labels=...).loss`` computes the same loss as
transformers' ``ForCausalLMLoss`` (labels shifted by one, ``-100`` ignored, mean over the counted
tokens) without the ``tokens x vocabulary`` tensors; ``logits`` comes back as None. Any causal LM whose
head is a plain ``nn.Linear`` (with or without a bias: Phi's) over its decoder's last hidden state and whose
loss is transformers' ``self.loss_function``: the decoder is the module transformers names by
``base_model_prefix`` (``model``, GPT-2's and Falcon's ``transformer``, ``gpt_neox``), the head
``get_output_embeddings()`` (``lm_head``, ``embed_out``). On a PEFT model
(before or after ``get_peft_model``) the kernel goes on the wrapped causal LM. The root module
still runs its own forward, so FSDP2's and DDP's hooks on it fire as usual. The planner's memory
model for each kernel is in ``advisor.estimate.activations_loss``.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

# What the kernels need and the config keys through which a causal LM changes its logits before the loss (a
# soft-cap, refused when truthy; a scale or divisor, refused when not 1): one table for the planner and the wrapper
from advisor.model.loss_kernels import HEAD_ADAPTER, HEAD_SHAPE, ROUTER_AUX, SCALE_KEYS, SOFT_CAP_KEYS

LossKernel = Literal["hf", "chunked", "fused"]
CHUNKS = 8  # sequence chunks; torchtune's CEWithChunkedOutputLoss uses 8 as well
IGNORE = -100


def causal_targets(labels: torch.Tensor) -> torch.Tensor:
    """``labels`` shifted left by one with ``-100`` at the end: what each position predicts."""
    return F.pad(labels, (0, 1), value=IGNORE)[..., 1:]


def chunked_cross_entropy(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, chunks: int = CHUNKS, *,
                          logits_first: bool = False) -> torch.Tensor:
    """Mean cross-entropy of ``head(hidden)`` against ``targets``, one chunk of tokens at a time: each
    chunk's low-precision logits die with the chunk; its fp32 log-softmax is what autograd keeps.
    ``logits_first``: every chunk's logits are made before any chunk's loss and live until the last one's, as
    when a model returns them chunked (torchtune's ``TransformerDecoder.chunked_output`` read by
    ``CEWithChunkedOutputLoss``; ``Recipe.chunked_logits`` 'model')."""
    flat, goal = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    total = hidden.new_zeros((), dtype=torch.float32)
    parts = [head(part) for part in flat.chunk(chunks)] if logits_first else flat.chunk(chunks)
    for part, want in zip(parts, goal.chunk(chunks)):
        # no name for a chunk's logits made here: they are freed as soon as .float() returns
        total = total + F.cross_entropy((part if logits_first else head(part)).float(), want, ignore_index=IGNORE,
                                        reduction="sum")
    del parts, part  # the held logits go with the loss's forward (nothing saved them)
    return total / (goal != IGNORE).sum().clamp(min=1)


NLL_CHUNK = 256  # tokens a chunk of the checkpointed kernel (TRL's _CHUNKED_LM_HEAD_CHUNK_SIZE)


def _nll_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's summed NLL in fp32, with the count of tokens predicted right and the summed entropy of the
    prediction (what TRL logs beside the loss)."""
    logits = hidden.float() @ weight.float().t()
    if bias is not None:
        logits = logits + bias.float()
    log_p = F.log_softmax(logits, dim=-1)
    loss = F.nll_loss(log_p, targets, ignore_index=IGNORE, reduction="sum")
    counted = targets != IGNORE
    right = ((logits.argmax(dim=-1) == targets) & counted).sum().float()
    entropy = (-(log_p.exp() * log_p).sum(dim=-1) * counted).sum()
    return loss, right, entropy


def checkpointed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                               bias: torch.Tensor | None = None, chunk: int = NLL_CHUNK) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T (+ bias)`` against ``targets`` over the counted tokens, as TRL's
    SFTTrainer computes it under ``loss_type="chunked_nll"`` (trl/trainer/sft_trainer.py
    ``_chunked_cross_entropy_loss``, the planner's ``Recipe.chunked_logits`` "checkpointed"): the counted tokens
    moved to the front in one copy of the hidden states, then ``chunk`` tokens at a time under non-reentrant
    ``torch.utils.checkpoint``, each chunk's logits made in fp32 from fp32 copies of its hidden states and of the
    whole weight, so nothing of a chunk outlives it and backward recomputes it. TRL skips the chunks past the
    counted tokens; here every chunk runs (no count read back from the device), adding nothing to the loss."""
    from torch.utils.checkpoint import checkpoint

    flat, goal = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    counted = goal != IGNORE
    order = counted.to(torch.int8).argsort(descending=True, stable=True)
    flat, goal = flat[order], goal[order]
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, goal.numel(), chunk):  # every chunk: no data-dependent count (the simulator's fake tensors)
        part, _, _ = checkpoint(_nll_chunk, flat[start:start + chunk], weight, bias, goal[start:start + chunk],
                                use_reentrant=False)
        total = total + part
    return total / counted.sum().clamp(min=1)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Loss and the gradients in one pass over chunks; backward only scales the saved gradients. A head bias
    adds to each chunk's logits (``addmm``, as ``F.linear`` computes it); its gradient is the sum over the
    chunk's rows of the logits' gradient, accumulated in fp32 beside the weight's. A weight or bias that needs no
    gradient (a frozen head: LoRA on the blocks) gets no accumulator (``ctx.needs_input_grad``): on Qwen2.5-7B the
    weight's is 152,064 x 3,584 fp32, 2.18 GB, and its copy in the head's dtype kept for backward."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunks: int) -> torch.Tensor:
        device = hidden.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        with torch.autocast(device, enabled=False):
            flat, goal = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
            count = (goal != IGNORE).sum().clamp(min=1)
            w = weight.to(compute)
            b = None if bias is None else bias.to(compute)
            grad_hidden = torch.empty_like(flat)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
                if ctx.needs_input_grad[1] else None
            grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) \
                if bias is not None and ctx.needs_input_grad[2] else None
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            start = 0
            for part, want in zip(flat.chunk(chunks), goal.chunk(chunks)):
                x = part.to(compute)
                logits = (x @ w.t() if b is None else torch.addmm(b, x, w.t())).float()
                keep = want != IGNORE
                safe = torch.where(keep, want, 0)
                lse = torch.logsumexp(logits, dim=-1)
                loss += ((lse - logits.gather(1, safe[:, None]).squeeze(1)) * keep).sum()
                grad = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                grad[torch.arange(len(safe), device=grad.device), safe] -= 1
                grad.mul_((keep / count)[:, None])
                if grad_weight is not None:
                    grad_weight.addmm_(grad.t(), part.float())  # fp32 x fp32: no vocabulary-sized copy
                if grad_bias is not None:
                    grad_bias += grad.sum(0)
                grad_hidden[start:start + len(part)] = grad.to(compute) @ w
                del logits, grad
                start += len(part)
        ctx.save_for_backward(grad_hidden.view_as(hidden),
                              None if grad_weight is None else grad_weight.to(weight.dtype),
                              None if grad_bias is None else grad_bias.to(bias.dtype))
        return loss / count

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_hidden * grad_loss, None if grad_weight is None else grad_weight * grad_loss,
                None if grad_bias is None else grad_bias * grad_loss, None, None)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               chunks: int = CHUNKS, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T (+ bias)`` against ``targets`` without keeping logits."""
    return _FusedLinearCrossEntropy.apply(hidden, weight, bias, targets, chunks)


def _forward(self: nn.Module, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs.pop("logits_to_keep", None)
    shift_labels, num_items = kwargs.pop("shift_labels", None), kwargs.pop("num_items_in_batch", None)
    decoder, head = getattr(self, self._advisor_parts[0]), getattr(self, self._advisor_parts[1])
    outputs = decoder(input_ids=input_ids, **kwargs)
    hidden = outputs.last_hidden_state
    if labels is None:
        return CausalLMOutputWithPast(logits=head(hidden))
    # transformers' ForCausalLMLoss contract: shift_labels as given (context parallelism shifts before
    # sharding), and a sum divided by num_items_in_batch when given.
    targets = causal_targets(labels) if shift_labels is None else shift_labels
    if self._advisor_loss == "fused":
        _refuse_adapted_head(head)  # PEFT adapted the head after use_loss_kernel
        loss = fused_linear_cross_entropy(hidden, head.weight, targets, bias=head.bias)
    elif self._advisor_checkpointed:
        _refuse_adapted_head(head, checkpointed=True)
        loss = checkpointed_cross_entropy(hidden, head.weight, targets, bias=head.bias)
    else:
        loss = chunked_cross_entropy(hidden, head, targets, logits_first=self._advisor_logits_first)
    if num_items is not None:
        loss = loss * ((targets != IGNORE).sum().clamp(min=1) / num_items)
    if getattr(outputs, "router_logits", None):  # output_router_logits: the decoder recorded its routers' logits
        return _with_router_aux_loss(self, loss, outputs.router_logits, kwargs.get("attention_mask"))
    return CausalLMOutputWithPast(loss=loss, logits=None)


# An MoE causal LM's forward in transformers 5.23 (modeling_mixtral.py MixtralForCausalLM and 29 more: Qwen2-MoE,
# Qwen3-MoE, OLMoE, PhiMoE, Jamba, GraniteMoE, ...): with output_router_logits it adds
# ``router_aux_loss_coef * load_balancing_loss_func(outputs.router_logits, num_experts, num_experts_per_tok,
# attention_mask)`` to the loss (after the division by num_items_in_batch). A forward that calls it otherwise
# (the multimodal ones read config.text_config) is not repeated: refused when it records router logits.
_ROUTER_AUX = re.compile(r"aux_loss = load_balancing_loss_func\(\s*outputs\.router_logits,\s*self\.num_experts,\s*"
                         r"self\.num_experts_per_tok,\s*attention_mask,?\s*\).*?"
                         r"loss \+= self\.router_aux_loss_coef \* aux_loss", re.S)


def _with_router_aux_loss(causal_lm: nn.Module, loss: torch.Tensor, router_logits: tuple, attention_mask: Any) -> Any:
    """``loss`` plus the routers' load-balancing loss as ``causal_lm``'s own forward adds it (``_ROUTER_AUX``),
    in transformers' MoE output; ValueError for a forward that adds it otherwise."""
    from transformers.modeling_outputs import MoeCausalLMOutputWithPast

    balance = _load_balancing_loss(causal_lm, causal_lm._advisor_loss)
    aux = balance(router_logits, causal_lm.num_experts, causal_lm.num_experts_per_tok, attention_mask)
    loss = loss + causal_lm.router_aux_loss_coef * aux.to(loss.device)
    return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux, logits=None, router_logits=router_logits)


def _load_balancing_loss(causal_lm: nn.Module, kernel: str) -> Any:
    """The ``load_balancing_loss_func`` of ``causal_lm``'s modeling module when its forward adds it as
    ``_ROUTER_AUX`` reads; ValueError otherwise."""
    cls = type(causal_lm)
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        source = ""
    balance = getattr(sys.modules.get(cls.__module__), "load_balancing_loss_func", None)
    if not _ROUTER_AUX.search(source) or balance is None:
        raise ValueError(f"loss kernel {kernel!r} {ROUTER_AUX.format(name=cls.__name__)}: use loss='hf'")
    return balance


def use_loss_kernel(model: nn.Module, kernel: LossKernel, *, logits_first: bool = False,
                    checkpointed: bool = False) -> nn.Module:
    """Make ``model`` (a Hugging Face causal LM whose head is a plain linear over its decoder's last hidden
    state: ``_decoder_and_head``) compute its loss with ``kernel``; ``"hf"`` leaves it as it is. Returns
    ``model``. ``logits_first``: the chunked kernel makes every chunk's logits before the first chunk's loss
    (``chunked_cross_entropy``); ``checkpointed``: the chunked kernel is TRL's chunked_nll
    (``checkpointed_cross_entropy``)."""
    if kernel == "hf":
        return model
    causal_lm = _causal_lm(model)
    parts = _decoder_and_head(causal_lm)
    if parts is None:
        raise ValueError(f"loss kernel {kernel!r} needs a causal LM {HEAD_SHAPE}; "
                         f"{type(causal_lm).__name__} is not one: use loss='hf'")
    transform = _logit_transform(getattr(causal_lm, "config", None))
    if transform:
        raise ValueError(f"loss kernel {kernel!r} computes the loss on the head's raw output; "
                         f"{type(causal_lm).__name__} transforms its logits first ({transform}): use loss='hf'")
    if kernel == "fused" or (checkpointed and kernel == "chunked"):
        _refuse_adapted_head(getattr(causal_lm, parts[1]), checkpointed=kernel == "chunked")
    if getattr(getattr(causal_lm, "config", None), "output_router_logits", False):
        _load_balancing_loss(causal_lm, kernel)  # refused now rather than at the first forward
    causal_lm._advisor_loss = kernel
    causal_lm._advisor_logits_first = logits_first and kernel == "chunked"
    causal_lm._advisor_checkpointed = checkpointed and kernel == "chunked"
    causal_lm._advisor_parts = parts  # attribute names, not modules (a module attribute would be a submodule)
    causal_lm.forward = types.MethodType(_forward, causal_lm)
    return model


# transformers' causal LMs call ``self.loss_function(logits, labels, ...)`` or ``(logits=logits, ...)`` (Falcon's
# variable is ``lm_logits``) on the head's output
_LOSS_ON_LOGITS = re.compile(r"self\.loss_function\(\s*(logits\s*=\s*)?(lm_)?logits\s*,")


def _decoder_and_head(causal_lm: nn.Module) -> tuple[str, str] | None:
    """The attribute names of ``causal_lm``'s decoder and head; None when it has no such pair.
    Through transformers' own API: the decoder is ``base_model`` (the child named by ``base_model_prefix``),
    else ``get_decoder()`` or ``.model`` (Llama 4's and Mllama's causal LMs name another prefix); the head is
    ``get_output_embeddings()``. Both direct children, no other child with parameters (BERT's ``cls``, RoBERTa's
    ``lm_head`` transform before their output linear), and a forward that hands the head's logits as they are
    to ``self.loss_function`` (transformers' ForCausalLMLoss: labels shifted by one; Bart's, Whisper's and
    XLNet's causal LMs take unshifted labels with their own CrossEntropyLoss, GIT drops its image tokens'
    logits first)."""
    children = dict(causal_lm.named_children())
    named = {id(module): name for name, module in children.items()}
    try:
        head = causal_lm.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = None
    if not isinstance(_base_linear(head), nn.Linear) or id(head) not in named:
        return None
    decoders = [getattr(causal_lm, "base_model", None), getattr(causal_lm, "model", None)]
    try:  # transformers' get_decoder: best effort, a bespoke model may raise
        decoders.insert(1, causal_lm.get_decoder())
    except (AttributeError, NotImplementedError, ValueError):
        pass
    decoder = next((named[id(m)] for m in decoders if m is not None and id(m) in named and m is not head), None)
    if decoder is None:
        return None
    others = [name for name, module in children.items() if name not in (decoder, named[id(head)])
              and next(module.parameters(), None) is not None]
    if others:
        return None
    try:
        source = inspect.getsource(type(causal_lm).forward)
    except (OSError, TypeError):
        source = ""
    if not _LOSS_ON_LOGITS.search(source):
        return None
    return decoder, named[id(head)]


def _base_linear(head: nn.Module | None) -> nn.Module | None:
    """The linear layer under PEFT's wrappers of a head: a tuner layer's ``base_layer`` (LoRA, DoRA, IA3, ...) and
    ``modules_to_save``'s ``original_module`` (duck-typed, no PEFT import); ``head`` itself otherwise."""
    for _ in range(4):  # a tuner layer over a modules_to_save wrapper, at most a few deep
        inner = getattr(head, "base_layer", None) or getattr(head, "original_module", None)
        if inner is None:
            return head
        head = inner
    return head


def _refuse_adapted_head(head: nn.Module, *, checkpointed: bool = False) -> None:
    """ValueError when ``head`` is a PEFT tuner layer whose forward adds its adapters to the base layer's output
    (enabled, not merged into the weight): its ``weight`` property is the base layer's, which is all the fused
    and the checkpointed kernels read (TRL refuses the same). The eager chunked kernel calls the module, adapters
    included."""
    if getattr(head, "base_layer", None) is not None and not getattr(head, "disable_adapters", False) \
            and not getattr(head, "merged", False):
        if checkpointed:
            raise ValueError(f"loss kernel 'chunked' as TRL's chunked_nll {HEAD_ADAPTER}: use loss='hf'")
        raise ValueError(f"loss kernel 'fused' {HEAD_ADAPTER}: use loss='chunked' (it calls the adapted head)")


def _logit_transform(config: object) -> str:
    """What a model does to its logits before the loss, which the kernels do not repeat: Gemma 2's final
    soft-capping (``final_logit_softcapping``), RecurrentGemma's ``logits_soft_cap``, xLSTM's
    ``output_logit_soft_cap``, Cohere's ``logit_scale``, Granite's ``logits_scaling``, Falcon-H1's
    ``lm_head_multiplier``; an empty string when the head's output is the logits."""
    found = [f"{key}={getattr(config, key)}" for key in SOFT_CAP_KEYS if getattr(config, key, None)]
    for key in SCALE_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and value != 1:
            found.append(f"{key}={value}")
    return ", ".join(found)


def _causal_lm(model: nn.Module) -> nn.Module:
    """The ``*ForCausalLM`` whose forward the kernel replaces. A PEFT model's ``.model`` resolves (through
    its ``__getattr__``) to the whole causal LM, not the decoder, so the kernel goes on the wrapped LM:
    PEFT's ``LoraModel.forward`` calls ``self.model.forward``, the instance attribute patched here, and
    a kernel set before ``get_peft_model`` is found the same way."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model
