"""``wrap()`` in one process on a model built on the meta device, with an optimizer (issue 21, item 1):
the returned optimizer steps the materialised parameters, so training moves the loss exactly as it
does for the same model built with weights (compared step by step with that model)."""

from __future__ import annotations

import torch
from tests.wrappers._dist import build_adamw, global_batch, tiny_llama

from wrappers import wrap
from wrappers.launch_env import read_launch_env


def _meta_llama() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    config = tiny_llama().config
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _step(model, optimizer, step: int) -> float:
    ids = global_batch(step)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def test_a_meta_model_trains_through_the_optimizer_wrap_returns(tmp_path):
    tiny_llama(0).save_pretrained(tmp_path)  # the weights both runs start from
    empty = _meta_llama()
    model, optimizer = wrap(empty, build_adamw(empty), checkpoint=str(tmp_path), env=read_launch_env({}),
                            verbose=False)
    assert not any(p.is_meta for p in model.parameters())
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in model.parameters()}
    reference = tiny_llama(0)
    reference_optimizer = build_adamw(reference)
    for step in range(3):
        assert _step(model, optimizer, step) == _step(reference, reference_optimizer, step)
    torch.testing.assert_close(model.state_dict(), reference.state_dict(), rtol=0, atol=0)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
