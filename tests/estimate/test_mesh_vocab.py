"""What the TP plans split (``profiles/tensor_parallel.json``), checked against the installed
transformers and ``wrappers.tensor_parallel`` on meta-device models, and what one rank then owns
(``advisor.estimate.model_parallel.tp_rank_spec``), counted by hand."""

from __future__ import annotations

import pytest

from advisor.estimate.model_parallel import tp_rank_spec, vocab_parallel
from advisor.model.bundled import load_tensor_parallel
from advisor.model.spec import ModelSpec

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False)


def _meta(model_type: str):
    import torch
    import transformers

    cfg = transformers.CONFIG_MAPPING[model_type](**TINY)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("model_type, has_plan", [("stablelm", False), ("opt", False), ("llama", True),
                                                  ("granite", True), ("cohere", True), ("phi", True)])
def test_no_tp_plan_list_is_what_wrappers_finds(model_type, has_plan):
    from wrappers.tensor_parallel import derived_plan, transformers_plan

    net = _meta(model_type)
    plan = transformers_plan(net)
    assert bool(plan) is has_plan
    assert (model_type in load_tensor_parallel().no_tp_plan) is not has_plan
    used = plan or derived_plan(net)
    split = {name.rsplit(".", 1)[-1] for name in used}
    assert ("embed_tokens" in split, "lm_head" in split) == (has_plan, has_plan)
    # Every layer a plan splits row-wise is in the row_parallel list (its kept output is a partial sum).
    rows = {name.rsplit(".", 1)[-1] for name, style in used.items() if style == "rowwise"}
    assert rows <= load_tensor_parallel().row_parallel
    assert rows or model_type == "opt"  # the derived plan names OPT's q/k/v only (out_proj, fc1, fc2 whole)


# Sweep row 0428af39138b's StableLM: h64, 4 blocks of 41,216 parameters, vocabulary 8,384 untied.
STABLELM = ModelSpec(name="sweep/stablelm-h64-l4-v8384", source="local", count_method="meta_device",
                     architecture="StableLmForCausalLM", model_type="stablelm", total_params=1_238_144,
                     trainable_params=1_238_144, embedding_params=536_576, layer_params=41_216, head_params=536_576,
                     other_params=128, tied_embeddings=False, num_layers=4, hidden_size=64, num_attention_heads=2,
                     num_kv_heads=2, head_dim=32, intermediate_size=128, vocab_size=8384,
                     max_position_embeddings=8192, block_classes=("StableLmDecoderLayer",))


def test_a_family_without_a_plan_keeps_embedding_and_head_whole_by_hand():
    """tp 2: a block (41,216 - 2 x 64 norm weights) / 2 + 128 = 20,672, four of them 82,688; the embedding and
    the head whole, 536,576 each (they were 268,288 each before: 619,392 in all, where simulate_mesh's rank holds
    1,156,256, the LayerNorm biases and q/k/v ones it also holds whole making the 288 more); the final norm 128."""
    assert not vocab_parallel(STABLELM)
    rank = tp_rank_spec(STABLELM, 2)
    assert (rank.embedding_params, rank.head_params, rank.layer_params) == (536_576, 536_576, 20_672)
    assert rank.total_params == 82_688 + 2 * 536_576 + 128 == 1_155_968


@pytest.mark.parametrize("model_type, copied", [("stablelm", True), ("phi", True), ("llama", False)])
def test_attention_output_copied_list_is_what_the_simulator_saves(model_type, copied):
    """One block on fake tensors (the simulator's mode): does o_proj keep a storage of its own beside SDPA's saved
    output (``profiles/tensor_parallel.json`` attention_output_copied)?"""
    import torch
    import transformers

    from advisor.simulate.fake_env import fake_mode
    from advisor.simulate.model import materialize

    cfg = transformers.CONFIG_MAPPING[model_type](**dict(TINY, attn_implementation="sdpa"))
    with torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(cfg)
    block = net.model.layers[0]
    o_proj = getattr(block.self_attn, "o_proj", None) or block.self_attn.dense
    storages: dict[str, int] = {}
    with fake_mode():
        materialize(net, device="cpu", real=False)
        hidden = torch.randn(1, 16, 64, requires_grad=True)
        rope = net.model.rotary_emb(hidden, torch.arange(16)[None])

        def o_proj_input(_, args) -> None:  # a pre-hook that returns something replaces the input
            storages.setdefault("o_proj", args[0].untyped_storage()._cdata)

        o_proj.register_forward_pre_hook(o_proj_input)

        def pack(t):
            if "Attention" in type(t.grad_fn).__name__:
                storages.setdefault("sdpa", t.untyped_storage()._cdata)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(hidden, position_embeddings=rope)
    assert (storages["o_proj"] != storages["sdpa"]) is copied
    assert (model_type in load_tensor_parallel().attention_output_copied) is copied
