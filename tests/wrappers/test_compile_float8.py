"""wrap()'s --compile and --float8: blocks compiled one by one (no compile is run here), float8's filter and the
error without torchao."""

from __future__ import annotations

import pytest
import torch
from tests.wrappers._dist import tiny_llama

from wrappers import wrap
from wrappers.blocks import find_blocks
from wrappers.compile_float8 import apply_compile, float8_filter


def _compiled(module: torch.nn.Module) -> bool:
    return module._compiled_call_impl is not None  # set by nn.Module.compile(), read by __call__


def test_compile_marks_each_decoder_block_and_nothing_else():
    model = tiny_llama(num_layers=3)
    blocks = apply_compile(model)
    assert len(blocks) == 3 and all(_compiled(b) for b in model.model.layers)
    assert not _compiled(model) and not _compiled(model.lm_head) and not _compiled(model.model.embed_tokens)


def test_wrap_compiles_the_blocks_when_asked():
    model = wrap(tiny_llama(num_layers=2), compile=True, verbose=False)  # CPU, one process: no strategy to apply
    assert all(_compiled(b) for b in model.model.layers)
    assert not any(_compiled(b) for b in wrap(tiny_llama(num_layers=2), verbose=False).model.layers)


def test_apply_recipe_compiles_before_the_strategy_wraps(monkeypatch):
    """apply_recipe's order (float8, checkpointing, compile, then the applier), without a process group."""
    from wrappers import recipe as recipe_module

    seen = []

    def applier(model, ctx):  # stands in for DDP, which needs a process group
        seen.append(all(_compiled(b) for b in find_blocks(model)))
        return model, None

    monkeypatch.setitem(recipe_module._APPLIERS, "ddp", applier)
    recipe_module.apply_recipe(tiny_llama(), recipe_module.Recipe(strategy="ddp", compile=True), device="cpu")
    assert seen == [True]


def test_an_optimizer_built_before_float8_all_gather_follows_the_new_weights(monkeypatch):
    """torchao's Float8Linear.from_float wraps each converted weight in a new Parameter when FSDP gathers fp8
    (``enable_fsdp_float8_all_gather``; read in torchao 0.17 float8_linear.py), so an optimizer built on the model
    before wrap() held the old ones: apply_recipe raised 'optimizer param group 0 has 14 parameters that are not
    in the model' (found running it with torchao 0.17 on a fake 8-rank group). Stand-in for torchao here: the
    same replacement of every block linear's weight."""
    from wrappers import compile_float8
    from wrappers import recipe as recipe_module

    def replace_weights(model, *, all_gather=False):
        for module in find_blocks(model)[0].modules():
            if isinstance(module, torch.nn.Linear):
                module.weight = torch.nn.Parameter(module.weight.detach().clone())
        return model

    seen = {}

    def applier(model, ctx):  # stands in for FSDP2 (applier "fsdp"), which needs a process group
        seen["optimizer"] = ctx.optimizer
        return model, ctx.optimizer

    monkeypatch.setattr(compile_float8, "apply_float8", replace_weights)
    monkeypatch.setitem(recipe_module._APPLIERS, "fsdp", applier)
    model = tiny_llama()
    optimizer = torch.optim.AdamW([{"params": list(model.model.layers.parameters()), "lr": 1e-3},
                                   {"params": list(model.lm_head.parameters()), "lr": 1e-4}], fused=True)
    applied = recipe_module.apply_recipe(
        model, recipe_module.Recipe(strategy="zero3", float8=True, float8_all_gather=True), device="cpu",
        optimizer=optimizer)
    held = [[id(p) for p in group["params"]] for group in applied.optimizer.param_groups]
    assert held == [[id(p) for p in model.model.layers.parameters()], [id(p) for p in model.lm_head.parameters()]]
    assert [g["lr"] for g in applied.optimizer.param_groups] == [1e-3, 1e-4] and applied.optimizer.defaults["fused"]
    assert seen["optimizer"] is applied.optimizer


def test_float8_without_torchao_is_one_line_naming_it():
    if __import__("importlib.util").util.find_spec("torchao") is not None:
        pytest.skip("torchao is installed here")
    with pytest.raises(ImportError, match=r"^--float8 needs torchao \(pip install torchao\)") as err:
        wrap(tiny_llama(), float8=True, verbose=False)
    assert "\n" not in str(err.value)


def test_float8_filter_takes_the_blocks_linears_with_dims_multiple_of_16_never_the_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    # By hand: hidden 64, 4 heads of 16, 2 KV heads -> q/o 64x64, k/v 64x32 (all multiples of 16);
    # MLP 64 <-> 72 (72 is not); head 64 x 128 (a multiple, but outside the blocks).
    config = LlamaConfig(hidden_size=64, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    keep = float8_filter(find_blocks(model))
    chosen = [name for name, module in model.named_modules() if keep(module, name)]
    assert chosen == [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"]


@pytest.mark.parametrize("kwargs,where", [
    (dict(tp=2, float8=True), "a pinned device mesh"),
    (dict(engine="accelerate", float8=True), "accelerate's prepare (engine=accelerate)"),
])
def test_compile_and_float8_are_refused_where_wrap_would_not_apply_them(kwargs, where):
    """A pinned mesh does not apply float8 and accelerate's prepare applies neither: wrap() says so in one line
    instead of returning a model that runs eager bf16, and leaves the model unwrapped and uncompiled (compile on a
    mesh: tests/wrappers/test_mesh_compile.py)."""
    model = tiny_llama(num_layers=2)
    with pytest.raises(ValueError) as err:
        wrap(model, verbose=False, **kwargs)
    message = str(err.value)
    assert "\n" not in message and where in message and "data-parallel path only" in message
    assert not any(_compiled(b) for b in model.model.layers)
