"""Which matrix products of one block selective checkpointing keeps, with or without LoRA / DoRA adapters.

The policy is torchtitan's op-level one (``wrappers.checkpointing.selective_context``, after
``torchtitan/models/llama3/infra/parallelize.py``): a counter runs over every ``aten.mm`` of the block in
forward order and the 1st, 3rd, 5th, ... outputs are saved (``MUST_SAVE``), everything else but the
attention kernels' outputs is recomputed. The counter sees every product, not only the base layers':

- a linear layer with a bias runs ``addmm``, which the counter skips (Qwen2's q, k and v);
- PEFT's LoRA (``peft/tuners/lora/layer.py`` ``Linear.forward``, peft 0.21) adds ``lora_A(x)`` and
  ``lora_B(.)`` after the base layer's product: two ``mm`` (r and out features a token);
- DoRA (``peft/tuners/lora/dora.py`` ``DoraLinearLayer.forward``) first builds the adapter's weight
  through the same layers, ``lora_B(lora_A(eye(in))).T`` (``get_lora_weight``: an ``in x r`` and an
  ``in x out`` product that do not grow with the tokens), then ``lora_B(lora_A(x))``; with dropout it
  runs the base layer's product once more on the dropped-out input (``F.linear(x, W)``, no bias).

So LoRA (two products more per adapted layer) and DoRA (four) leave the base layers their turns and keep
every other one of their own; DoRA with dropout (five) moves every turn after it. The list was read off a Llama, a Qwen2 and a
StarCoder2 block under PEFT 0.21 with a recording policy (``tests/model/test_selective.py`` checks it
against the policy itself). Pure: shapes from ``advisor.model.lora.block_linears``, no torch.

What a kept output costs: it is held from the block's forward to its recomputation in backward, which
takes it back (and frees those backward does not read: q, lora_B's output, DoRA's weight products). A
recomputation stops at the last tensor backward saves (non-reentrant checkpointing's early stop,
``torch.utils.checkpoint._StopRecomputationError``): a kept product after it is never taken back and
stays held through the block's backward (the *tail*: Llama's ``down_proj``, or LoRA's ``lora_B`` on it).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from advisor.frozen import per_instance
from advisor.model.bundled import load_architectures
from advisor.model.lora import LoraConfig, block_linears, target_names
from advisor.model.spec import ModelSpec

_QKV = ("q_proj", "k_proj", "v_proj", "qkv_proj")

Role = Literal["base", "lora_A", "lora_B", "dora_weight_A", "dora_weight_B", "dora_base"]


class Product(NamedTuple):
    """One matrix product of a block, in forward order."""

    linear: str  # the block's linear layer it belongs to ("q_proj")
    role: Role
    fan_in: int  # the linear layer's input features (rows of DoRA's weight products; lora_B: r)
    width: int  # output features a token (0: a product of weights, DoRA's)
    elements: int  # output elements that do not grow with the tokens (DoRA's weight products)
    counted: bool  # an aten.mm, which the policy counts (a biased base layer runs addmm: not counted)


class SelectiveKept(NamedTuple):
    """What selective checkpointing keeps of one block beyond its input and the attention kernel's outputs."""

    width: int  # output features a token of the kept products
    elements: int  # output elements of the kept products that do not grow with the tokens
    tail_width: int  # of ``width``: the products past the recomputation's early stop
    linears: tuple[tuple[int, int], ...]  # (in, out) of the base layers whose product is kept (FLOPs)


def block_products(spec: ModelSpec, lora: LoraConfig | None = None) -> tuple[Product, ...] | None:
    """The matrix products of one block in forward order, with ``lora``'s adapters (module docstring).
    None where the block is not a known dense Llama-like decoder."""
    info = load_architectures().get(spec.model_type or "")
    if info is None or info.formula != "decoder" or info.moe:
        return None
    adapted = set(target_names(spec, lora)) if lora is not None else set()
    products: list[Product] = []
    for name, shapes in block_linears(spec).items():
        biased = info.qkv_bias and name in _QKV
        for fan_in, fan_out in shapes:
            products.append(Product(name, "base", fan_in, fan_out, 0, not biased))
            if name not in adapted:
                continue
            r = lora.rank
            if lora.dora:  # get_lora_weight: lora_B(lora_A(eye(in)))
                products += [Product(name, "dora_weight_A", fan_in, 0, fan_in * r, True),
                             Product(name, "dora_weight_B", fan_in, 0, fan_in * fan_out, True)]
            products += [Product(name, "lora_A", fan_in, r, 0, True), Product(name, "lora_B", r, fan_out, 0, True)]
            if lora.dora and lora.dropout > 0:  # base_result=None: F.linear(dropout(x), W), no bias
                products.append(Product(name, "dora_base", fan_in, fan_out, 0, True))
    return tuple(products)


@per_instance
def selective_kept(spec: ModelSpec, lora: LoraConfig | None = None) -> SelectiveKept | None:
    """The products the policy keeps in one block (every other counted one, from the first) and the
    tail among them: the block's last product when it is kept and is a base layer's or plain LoRA's
    ``lora_B``, whose output backward does not read (the recomputation stops at the op before, whose inputs
    are the last tensors saved); DoRA's last ``lora_B`` output is read (its magnitude's gradient), so no
    tail. Checked against the simulated step as the difference to full checkpointing (tests/model/
    test_selective.py). None where ``block_products`` is None."""
    products = block_products(spec, lora)
    if products is None:
        return None
    counted = [p for p in products if p.counted]
    kept = counted[0::2]
    last = products[-1]
    plain_lora = last.role == "lora_B" and not (lora is not None and lora.dora)
    tail = last.width if last.counted and len(counted) % 2 == 1 and (last.role == "base" or plain_lora) else 0
    return SelectiveKept(width=sum(p.width for p in kept), elements=sum(p.elements for p in kept), tail_width=tail,
                         linears=tuple((p.fan_in, p.width) for p in kept if p.role == "base"))
