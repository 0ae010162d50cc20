"""The TP plan ``wrap(mesh=...)`` applies, the degrees it accepts, and the one-process meta path.

Single process, no process group: what the plan splits is compared with transformers' own plan
strings and PyTorch's style classes; bad degrees must fail with a ``ValueError`` naming the
constraint before any process group is touched; a meta-device model initialised in one process must
match transformers' own initialisation rules (and its rotary frequencies exactly).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tests.conftest import TINY_CONFIGS
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from advisor.mesh import ParallelDims
from wrappers import wrap
from wrappers.launch_env import LaunchEnv
from wrappers.mesh import resolve_dims
from wrappers.tensor_parallel import derived_plan, resolve_plan

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, tie_word_embeddings=False)


def _meta(**config) -> nn.Module:
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**config))


def _env(world_size: int) -> LaunchEnv:
    return LaunchEnv(world_size=world_size, rank=0, local_rank=0, local_world_size=world_size, num_gpus=0,
                     gpu_name=None, accelerate_plugin=None)


def test_llama_uses_its_transformers_plan():
    styles, source = resolve_plan(_meta(**SMALL))
    assert source == "the model's transformers TP plan"
    for layer in range(2):
        for leaf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            assert type(styles[f"model.layers.{layer}.{leaf}"]) is ColwiseParallel
        for leaf in ("self_attn.o_proj", "mlp.down_proj"):
            assert type(styles[f"model.layers.{layer}.{leaf}"]) is RowwiseParallel
    assert styles["lm_head"].output_layouts == (Replicate(),)  # logits gathered for the loss
    assert styles["model.embed_tokens"].input_layouts == (Replicate(),)  # token ids whole on every rank
    assert len(styles) == 2 * 7 + 2  # nothing else: norms and rotary embeddings stay replicated


def test_tied_embedding_and_head_stay_replicated():
    config = AutoConfig.for_model(**TINY_CONFIGS["llama_tied_bias"])
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    styles, _ = resolve_plan(model)
    assert "lm_head" not in styles and "model.embed_tokens" not in styles and len(styles) == 2 * 7


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(8, 8) for _ in range(4))
        self.up_proj, self.down_proj, self.norm = nn.Linear(8, 16), nn.Linear(16, 8), nn.LayerNorm(8)


def test_a_plain_module_gets_the_plan_derived_from_layer_names():
    model = nn.Sequential(_Block(), _Block())
    assert derived_plan(model) == {f"{i}.{leaf}": style for i in "01" for leaf, style in (
        ("q_proj", "colwise"), ("k_proj", "colwise"), ("v_proj", "colwise"), ("o_proj", "rowwise"),
        ("up_proj", "colwise"), ("down_proj", "rowwise"))}
    assert resolve_plan(model)[1] == "a plan derived from the linear layer names"


def test_degrees_resolve_to_one_parallel_dims():
    assert resolve_dims(None, world_size=8, tp=2) == ParallelDims(dp_shard=4, tp=2, world_size=8)
    assert resolve_dims(None, world_size=8, hybrid=2, tp=2) == ParallelDims(dp_replicate=2, dp_shard=2, tp=2,
                                                                            world_size=8)
    assert resolve_dims({"dp_shard": 2, "cp": 2, "world_size": 4}, world_size=4).cp == 2
    recommendation = SimpleNamespace(mesh=ParallelDims(dp_shard=2, tp=2, world_size=4))  # a plan's, duck-typed
    assert resolve_dims(recommendation, world_size=4).tp == 2
    with pytest.raises(ValueError, match="does not divide the 6 ranks"):
        resolve_dims(None, world_size=6, tp=4)
    with pytest.raises(ValueError, match="is for 4 ranks; this launch has 8"):
        resolve_dims(ParallelDims(dp_shard=4, world_size=4), world_size=8)
    with pytest.raises(ValueError, match="either mesh= or tp="):
        resolve_dims(ParallelDims(dp_shard=4, world_size=4), world_size=4, tp=2)


def test_bad_degrees_fail_before_any_process_group():
    with pytest.raises(ValueError, match="--tp 3 does not divide the model's 4 attention heads"):
        wrap(_meta(**SMALL), tp=3, env=_env(3))
    with pytest.raises(ValueError, match="context parallelism needs CUDA"):
        wrap(_meta(**SMALL), cp=2, env=_env(2))


def test_one_process_initialises_a_meta_model_like_transformers():
    model = wrap(LlamaConfig(**SMALL), env=_env(1), verbose=False)  # a config: built on meta, then initialised
    assert not any(p.is_meta for p in model.parameters()) and model.advisor_decision.strategy is None
    torch.manual_seed(0)
    reference = LlamaForCausalLM(LlamaConfig(**SMALL))
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq, rtol=0, atol=0)
    for name, param in model.named_parameters():
        if param.ndim == 1:  # RMSNorm weights start at one
            assert torch.equal(param, torch.ones_like(param)), name
        else:  # N(0, initializer_range) like transformers' _init_weights; 1024+ samples each
            assert abs(param.std().item() - 0.02) < 0.003 and abs(param.mean().item()) < 0.003, name
    ids = torch.randint(0, 128, (2, 8))
    loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss == pytest.approx(reference(input_ids=ids, labels=ids).loss.item(), rel=0.02)  # ~ln(128) both


def test_wrap_follows_a_plan_that_needs_a_mesh():
    """On 8 H100s at 131,072 tokens nothing in the data-parallel family fits Llama-3.1-8B (zero3 needs
    ~250 GiB a GPU); the planner recommends context parallelism and wrap() must apply that mesh, not
    the strategy alone."""
    from advisor.model.sources import resolve_model
    from wrappers.wrap import decide

    env = LaunchEnv(world_size=8, rank=0, local_rank=0, local_world_size=8, num_gpus=1,
                    gpu_name="NVIDIA H100 80GB HBM3", accelerate_plugin=None)
    decision = decide(resolve_model("meta-llama/Llama-3.1-8B"), env, seq_len=131072, micro_batch_size=1)
    assert decision.mesh is not None and decision.mesh.cp > 1
    assert decision.mesh.world_size == 8
