"""The pieces of one pipeline stage the simulator runs: its chunks of decoder layers, and linear
layers whose weight gradient can be deferred (the zero-bubble W pass).

What belongs here: building a chunk (a run of decoder layers; the embeddings on the first chunk of
the pipeline, the final norm, head and loss on the last) from a Hugging Face config on the meta
device, and the linear layer that computes the input gradient in B and stashes what W needs. What
does not: the order of passes (``advisor.simulate.pipeline_order``) and measuring
(``advisor.simulate.pipeline_stage``).

A chunk is the Hugging Face model built with the chunk's number of layers. A chunk that is not the
pipeline's first keeps no token embedding (a one-row stub; GPT-2's learned positions become one
column, which broadcasts) and takes the received hidden states as ``inputs_embeds``; one that is
not the last replaces the final norm by an identity and returns the hidden states. A tied head on
the last chunk keeps the embedding matrix, as Megatron keeps a copy of it on the last stage.

Deferred weight gradients follow the zero-bubble implementation (Qi et al. 2024, section 2;
sail-sg/zero-bubble-pipeline-parallelism ``WeightGradStore``): B computes dX = dY W and keeps X and
dY for each linear layer; W computes dW = dY^T X and frees them. Under autocast the layers read the
compute-dtype copy of each weight made once per step (as autocast's weight cache does) and save the
compute-dtype copy of their input (as autocast's ``linear`` does).

Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from advisor.model.config_keys import CONFIG_KEYS

NORM_NAMES = ("ln_f", "norm", "final_layernorm", "final_layer_norm")


class WeightGradStore:
    """What each pending W pass needs, by (micro-batch, chunk); and the step's weight copies."""

    def __init__(self) -> None:
        self.defer = False
        self.key: tuple[int, int] | None = None
        self.pending: dict[tuple[int, int], list[tuple[nn.Parameter, torch.Tensor, torch.Tensor, bool]]] = {}
        self.compute_dtype: torch.dtype | None = None
        self._copies: dict[int, torch.Tensor] = {}

    def weight(self, param: nn.Parameter) -> torch.Tensor:
        """The parameter in the compute dtype, detached (its gradient is ours to compute)."""
        if self.compute_dtype is None or param.dtype == self.compute_dtype:
            return param.detach()
        if id(param) not in self._copies:
            self._copies[id(param)] = param.detach().to(self.compute_dtype)
        return self._copies[id(param)]

    def end_step(self) -> None:
        self._copies.clear()
        assert not self.pending, "every deferred W pass ran"

    def run_w(self, key: tuple[int, int]) -> None:
        with torch.no_grad():  # the stashed input is a graph tensor: no graph may grow from dW
            for param, x, grad_y, transposed in self.pending.pop(key, []):
                _accumulate(param, _weight_grad(x, grad_y, transposed))


def _weight_grad(x: torch.Tensor, grad_y: torch.Tensor, transposed: bool) -> torch.Tensor:
    x2, g2 = x.reshape(-1, x.shape[-1]), grad_y.reshape(-1, grad_y.shape[-1])
    return x2.t() @ g2 if transposed else g2.t() @ x2


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad.to(param.dtype)
    else:
        param.grad.add_(grad)


class _Linear(torch.autograd.Function):
    """y = x W^T + b (``transposed``: x W + b, transformers' Conv1D); see the module docstring."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, param: nn.Parameter, layer: nn.Module, store: WeightGradStore,
                transposed: bool) -> torch.Tensor:
        # ``param`` (the weight) is an input only so that the output wants a gradient whenever the weight
        # trains; its gradient is ours to compute (backward returns None for it).
        weight = store.weight(layer.weight)
        x_c = x if store.compute_dtype is None else x.to(store.compute_dtype)
        y = x_c @ (weight if transposed else weight.t())
        if layer.bias is not None:
            y = y + store.weight(layer.bias)
        ctx.save_for_backward(x_c)
        ctx.layer, ctx.store, ctx.transposed, ctx.x_dtype = layer, store, transposed, x.dtype
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        (x_c,) = ctx.saved_tensors
        layer, store = ctx.layer, ctx.store
        weight = store.weight(layer.weight)
        grad_x = grad_y @ (weight.t() if ctx.transposed else weight) if ctx.needs_input_grad[0] else None
        if layer.bias is not None:
            _accumulate(layer.bias, grad_y.reshape(-1, grad_y.shape[-1]).sum(0))
        if store.defer:
            store.pending.setdefault(store.key, []).append((layer.weight, x_c, grad_y, ctx.transposed))
        else:
            _accumulate(layer.weight, _weight_grad(x_c, grad_y, ctx.transposed))
        return (None if grad_x is None else grad_x.to(ctx.x_dtype)), None, None, None, None


def defer_linears(module: nn.Module, store: WeightGradStore) -> int:
    """Route every ``nn.Linear`` and transformers ``Conv1D`` under ``module`` through ``_Linear``."""
    count = 0
    for layer in module.modules():
        transposed = type(layer).__name__ == "Conv1D"
        if not (isinstance(layer, nn.Linear) or transposed):
            continue

        def forward(x: torch.Tensor, layer: nn.Module = layer, transposed: bool = transposed) -> torch.Tensor:
            return _Linear.apply(x, layer.weight, layer, store, transposed)

        layer.forward = forward
        count += 1
    return count


class Chunk(nn.Module):
    """A run of decoder layers of one model; see the module docstring."""

    def __init__(self, net: nn.Module, *, first: bool, last: bool) -> None:
        super().__init__()
        self.net, self.first, self.last = net, first, last

    @property
    def base(self) -> nn.Module:
        return self.net.base_model

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss on the last chunk, else the hidden states to send on."""
        feed = {"input_ids": inputs} if self.first else {"inputs_embeds": inputs}
        if self.last:
            return self.net(**feed, labels=labels).loss
        return self.base(**feed).last_hidden_state


def build_chunk(cfg: dict, *, num_layers: int, first: bool, last: bool, attention: str) -> Chunk:
    """The chunk on the meta device (``advisor.simulate.model.materialize`` gives it storage)."""
    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import simulation_config

    if num_layers < 0:
        raise ValueError("a chunk holds zero or more layers")
    layered = dict(cfg)
    key = next((k for k in CONFIG_KEYS["num_layers"] if k in cfg), CONFIG_KEYS["num_layers"][0])
    layered[key] = num_layers
    if not first and cfg.get("model_type") == "gpt2":
        layered["embd_pdrop"] = 0.0  # embedding dropout is the first stage's; GPT-2 applies it to inputs_embeds too
    net = build_meta_model(simulation_config(layered, attention=attention))
    base = net.base_model
    hidden = net.get_input_embeddings().embedding_dim
    with torch.device("meta"):
        if not first:
            # The head of a tied last chunk keeps the matrix (lm_head.weight is the same Parameter).
            base.set_input_embeddings(nn.Embedding(1, hidden))
            if isinstance(getattr(base, "wpe", None), nn.Embedding):  # GPT-2's learned positions: stage 0's
                base.wpe = nn.Embedding(base.wpe.num_embeddings, 1)
        if not last:
            if net.get_output_embeddings() is not None:  # a tied head would keep the whole matrix
                net.set_output_embeddings(nn.Linear(hidden, 1, bias=False))
            for name in NORM_NAMES:
                if isinstance(getattr(base, name, None), nn.Module):
                    setattr(base, name, nn.Identity())
    return Chunk(net, first=first, last=last)
