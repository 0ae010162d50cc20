"""QLoRA's saved activations per decoder layer, measured on real CPU tensors, against the estimate.

The simulator cannot run bitsandbytes, so the QLoRA activation count (a frozen base's layer, ``advisor.estimate.
activations_blocks.frozen_decoder_layer_per_token``, with the dtypes of ``advisor.estimate.memory.recipe_dtypes``)
had never been checked against execution. Here a tiny transformers Llama runs one forward under bf16 autocast
(CPU) with every block linear replaced by a stand-in that has bitsandbytes' ``Linear4bit`` dtype rule
(bitsandbytes/nn/modules.py ``Linear4bit.forward``: the input cast to the compute dtype, the product cast back to
the input's dtype; a frozen weight, so nothing of the input is saved for it) and wrapped as PEFT wraps a 4-bit
linear (peft/tuners/lora/bnb.py ``Linear4bit.forward``: the base result cloned, no input cast while autocast is on,
fp32 adapters, the adapter output added). The embedding and head are bf16 (TRL casts them back for a 4-bit model);
the norms fp32 (PEFT's prepare_model_for_kbit_training, the Trainer's TRL path: ``Recipe.kbit_upcast`` true) or bf16
(a base left as loaded: false). Every tensor autograd saves inside a decoder layer is counted once (by storage),
per layer, the parameters it saves by reference left out; the estimate is the planner's own layer count for the same shape and recipe, no checkpointing.

Run: PYTHONPATH=$PWD python benchmarks/qlora_layer_bytes.py (prints the table of benchmarks/results/qlora_layer_bytes.md)
"""

from __future__ import annotations

import torch
import transformers

from advisor.estimate.activations import estimate_activations, shape_of
from advisor.estimate.memory import _adapters, recipe_dtypes
from advisor.model.lora import LoraConfig, with_lora
from advisor.model.sources import spec_from_config
from advisor.recipes import get_recipe
from advisor.frozen import validated_copy
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig

CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=704,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
              max_position_embeddings=1024, tie_word_embeddings=False, _name_or_path="tiny-llama-qlora")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK, TOKENS = 8, 256


class Linear4bitDtypes(torch.nn.Module):
    """bitsandbytes Linear4bit's dtype rule on an unquantised frozen weight."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)

    def forward(self, x):
        return torch.nn.functional.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)


class BnbLora(torch.nn.Module):
    """PEFT's LoRA over a 4-bit linear, as its forward runs under autocast."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.base_layer = Linear4bitDtypes(linear)
        self.lora_A = torch.nn.Linear(linear.in_features, RANK, bias=False)
        self.lora_B = torch.nn.Linear(RANK, linear.out_features, bias=False)

    def forward(self, x):
        result = self.base_layer(x).clone()  # "for 4bit, we need to defensively clone here"
        return result + self.lora_B(self.lora_A(x)) * 2.0


def qlora_model(norm_dtype: torch.dtype):
    """The tiny Llama in bf16, every block linear a 4-bit stand-in under a LoRA adapter, the norms in ``norm_dtype``."""
    config = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures",
                                                                                       "_name_or_path")})
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.requires_grad_(False)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if name in TARGETS:
                    setattr(parent, name, BnbLora(child))
    for name, module in model.named_modules():
        if name.split(".")[-1].endswith("norm"):
            module.to(norm_dtype)
    return model.train()


def measured_per_layer(norm_dtype: torch.dtype) -> list[int]:
    """Bytes autograd saves inside each decoder layer, storages counted once."""
    model = qlora_model(norm_dtype)
    inside: list[int | None] = [None]
    seen: list[dict[int, int]] = [dict() for _ in model.model.layers]
    for index, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda module, args, i=index: inside.__setitem__(0, i))
        layer.register_forward_hook(lambda module, args, out: inside.__setitem__(0, None))

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # saved by reference: no new memory

    def pack(tensor):
        if inside[0] is not None:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in weights and not any(storage.data_ptr() in layer for layer in seen):
                seen[inside[0]][storage.data_ptr()] = storage.nbytes()  # a storage once, in the first layer (RoPE)
        return tensor

    ids = torch.randint(0, CONFIG["vocab_size"], (1, TOKENS))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, labels=ids)
    return [sum(layer.values()) for layer in seen]


def estimated_per_layer(kbit_upcast: bool) -> int:
    lora = LoraConfig(rank=RANK, targets=TARGETS)
    recipe = validated_copy(get_recipe("trainer"), {"kbit_upcast": kbit_upcast, "sources": {
        **get_recipe("trainer").sources, "kbit_upcast": "benchmarks/qlora_layer_bytes.py"}})
    training = TrainingConfig(recipe=recipe, seq_len=TOKENS, lora=lora, quantize="nf4", precision="bf16-mixed")
    spec = with_lora(spec_from_config(CONFIG, name=CONFIG["_name_or_path"], source="local"), lora)
    impl = get_strategy("ddp").on("torch")
    acts = estimate_activations(shape_of(spec), recipe_dtypes(training, impl), micro_batch_size=1, seq_len=TOKENS,
                                checkpointing=False, eager=False, adapters=_adapters(spec, training),
                                head_frozen=True)
    return acts.layer_bytes


def rows() -> list[tuple[str, list[int], int]]:
    torch.manual_seed(0)
    return [("norms fp32 (kbit_upcast true: TRL)", measured_per_layer(torch.float32), estimated_per_layer(True)),
            ("norms bf16 (kbit_upcast false: LLaMA-Factory)", measured_per_layer(torch.bfloat16),
             estimated_per_layer(False))]


def main() -> None:
    lines = ["| path | measured per layer (bytes, layers 0..2) | estimated per layer | error (layers 1..2) |",
             "|---|---|---:|---:|"]
    for label, measured, estimate in rows():
        later = measured[1:]
        error = (estimate / (sum(later) / len(later)) - 1) * 100
        lines.append(f"| {label} | {', '.join(f'{m:,}' for m in measured)} | {estimate:,} | {error:+.1f}% |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
