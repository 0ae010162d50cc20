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


def _shard_like_context_parallel(rank: int, world_size: int) -> None:
    """Rank ``rank`` of a cp 2 mesh: shard with torch's own rule (what ``context_parallel`` does inside:
    the default head-tail load balancer, then a Shard(seq) split) and check against the hand-worked
    split, and the loss the ranks average against the whole sequence's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental._context_parallel._attention import _context_parallel_buffers
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _create_default_load_balancer,
    )
    from transformers.loss.loss_utils import ForCausalLMLoss

    from tests.wrappers._dist import tiny_llama
    from wrappers.tensor_parallel import prepare_context_parallel_input

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("cp",))
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]])
    batch = prepare_context_parallel_input(ids, cp=world_size)
    balancer = _create_default_load_balancer(ids.shape[1], world_size, "cpu")
    shard_ids, shard_pos, shard_targets = _context_parallel_buffers(mesh, batch.buffers, batch.seq_dims, balancer)
    # Head-tail: chunks of 2 tokens, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    expected = {0: ([10, 11, 16, 17], [0, 1, 6, 7], [11, 12, 17, -100]),
                1: ([12, 13, 14, 15], [2, 3, 4, 5], [13, 14, 15, 16])}[rank]
    assert (shard_ids[0].tolist(), shard_pos[0].tolist(), shard_targets[0].tolist()) == expected
    # The pairs (position, target) of both shards together are the unsharded batch's, each once.
    pairs = [None, None]
    dist.all_gather_object(pairs, list(zip(shard_pos[0].tolist(), shard_targets[0].tolist())))
    assert sorted(pairs[0] + pairs[1]) == list(zip(range(8), [11, 12, 13, 14, 15, 16, 17, -100]))

    # The loss: ring attention gives each rank the whole sequence's logits at its positions; the
    # ranks' losses (sums over count / cp) average, as FSDP averages gradients, to the whole mean.
    torch.manual_seed(0)
    logits = tiny_llama()(input_ids=torch.randint(0, 128, (1, 8))).logits.detach()
    shard_logits = logits[:, shard_pos[0]]
    vocab = logits.shape[-1]
    whole = ForCausalLMLoss(logits, ids, vocab)
    mine = ForCausalLMLoss(shard_logits, shard_targets, vocab, shift_labels=shard_targets,
                           num_items_in_batch=batch.num_items_in_batch)
    dist.all_reduce(mine, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(mine, whole)
    # The old recipe (ids and labels sharded, the model shifting): another loss.
    old = ForCausalLMLoss(shard_logits, shard_ids, vocab)
    dist.all_reduce(old, op=dist.ReduceOp.AVG)
    assert not torch.allclose(old, whole)


def test_context_parallel_input_keeps_positions_and_targets_aligned():
    """cp 2 over 8 tokens ``10..17``. The documented step used to shard ``[ids, labels]`` only: rank 0
    held ids ``10 11 16 17`` and labels the same, so transformers' shift inside the model trained
    11 -> 16 (chunks 0 and 3 are not neighbours) and dropped 17's target, rank 1 trained 15 -> nothing,
    and both ranks ran RoPE at positions 0..3 (rank 0's tokens sit at 0, 1, 6, 7). With
    ``prepare_context_parallel_input`` positions travel with the tokens and targets are shifted before
    sharding, so the shards' (position, target) pairs are the whole sequence's and the averaged loss
    is its mean."""
    from tests.wrappers._dist import run_scenarios

    run_scenarios({"cp": (_shard_like_context_parallel,)}).check("cp")


@pytest.mark.parametrize("kernel", ["hf", "fused"])
def test_context_parallel_kwargs_give_the_models_own_loss(kernel):
    """cp 1 (nothing sharded): ``model(**batch.model_kwargs)`` with pre-shifted labels is the loss of
    ``model(input_ids=ids, labels=ids)``, through transformers' loss and through the fused kernel; at
    cp 2 the divisor halves, so each rank's sum counts for half the whole mean."""
    from tests.wrappers._dist import global_batch, tiny_llama
    from wrappers.losses import use_loss_kernel
    from wrappers.tensor_parallel import prepare_context_parallel_input

    ids = global_batch(0)
    labels = ids.clone()
    labels[:, :3] = -100
    model = use_loss_kernel(tiny_llama(), kernel)
    expected = tiny_llama()(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(model(**prepare_context_parallel_input(ids, labels, cp=1).model_kwargs).loss, expected)
    doubled = model(**prepare_context_parallel_input(ids, labels, cp=2).model_kwargs).loss
    torch.testing.assert_close(doubled, 2 * expected)
