"""``wrap(mesh=...)`` for real: 4 gloo ranks on CPU, a tiny Llama built on the meta device and loaded
from a ``save_pretrained`` directory, against one process training on the whole batch.

One scenario per mesh checks in turn: the weights each rank loaded
from safetensors are exactly ``from_pretrained``'s; every parameter's placement and local shape on
each mesh dimension (worked by hand below); parity after 3 AdamW steps; the loader split over the
data-parallel ranks only; a sharded (DCP) checkpoint round trip over the 2-D mesh, continued one step
bit for bit; and the initialise path (same values on every replica, whatever the mesh). Both meshes
run in one set of 4 processes (spawning is the expensive part), each in its own process group.

Tolerance: atol 1e-5 (rtol 1e-5). Gradients differ from one process's by float32 rounding in the
reduction order (4 one-sample means reduced by reduce-scatter / all-reduce and, under TP, partial
matmul sums all-reduced, against one 4-sample mean). AdamW divides by sqrt(v): for gradient entries
near the rounding noise the update (at most lr = 2e-3 per step) can move by a small fraction of lr.
Measured: max |diff| 3.5e-7 (TP 2 x FSDP 2) and 2.7e-6 (HSDP 2 x 2) after 3 steps; 1e-5 is 0.5% of
one step's largest move, while a wrong reduction (sum instead of mean, a missing TP all-reduce)
shifts parameters by about lr per step.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from tests.wrappers._dist import (
    GLOBAL_BATCH, ScenarioResults, assert_params_close, build_adamw, global_batch, launch_env, reference_params,
    run_scenarios, tiny_llama, train_steps,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from advisor.mesh import ParallelDims
from wrappers import wrap
from wrappers.checkpoint_io import load_checkpoint, save_checkpoint

NUM_STEPS = 3
RTOL, ATOL = 1e-5, 1e-5
MESHES = {
    "tp2_fsdp2": ParallelDims(dp_shard=2, tp=2, world_size=4),
    "hsdp2x2": ParallelDims(dp_replicate=2, dp_shard=2, world_size=4),
}
# Local shapes by hand, tests/wrappers/_dist.py's Llama (hidden 32, 4 heads of 8, 2 KV heads, MLP 64,
# vocab 128). TP 2 x FSDP 2: q [32, 32] is split by TP (rows, column-wise) and FSDP (rows): 8 x 32;
# o [32, 32] by TP on columns (row-wise) and FSDP on rows: 16 x 16; k [16, 32]: 4 x 32; the
# embedding [128, 32] by TP (vocabulary) and FSDP: 32 x 32; a norm [32] by FSDP alone: 16.
# HSDP 2 x 2: everything sharded in halves on dim 0, replicated across the two replicas.
LOCAL_SHAPES = {
    "tp2_fsdp2": {"model.layers.0.self_attn.q_proj.weight": (8, 32), "model.layers.0.self_attn.o_proj.weight": (16, 16),
                  "model.layers.0.self_attn.k_proj.weight": (4, 32), "model.embed_tokens.weight": (32, 32),
                  "model.layers.0.mlp.down_proj.weight": (16, 32), "model.norm.weight": (16,),
                  "lm_head.weight": (32, 32)},
    "hsdp2x2": {"model.layers.0.self_attn.q_proj.weight": (16, 32), "model.layers.0.self_attn.o_proj.weight": (16, 32),
                "model.layers.0.self_attn.k_proj.weight": (8, 32), "model.embed_tokens.weight": (64, 32),
                "model.layers.0.mlp.down_proj.weight": (16, 64), "model.norm.weight": (16,),
                "lm_head.weight": (64, 32)},
}


def _meta_llama() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    config = tiny_llama().config
    with torch.device("meta"):
        return LlamaForCausalLM(config)  # the same architecture, no storage


def _wrapped(rank: int, world_size: int, dims: ParallelDims, checkpoint: str | None):
    model = _meta_llama()
    assert all(p.is_meta for p in model.parameters())
    loader = DataLoader(list(global_batch(0)), batch_size=GLOBAL_BATCH // dims.dp)
    return wrap(model, build_adamw(model), loader, mesh=dims, checkpoint=checkpoint, env=launch_env(rank, world_size),
                verbose=False)


def _full(model) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _assert_placements(model, kind: str, dims: ParallelDims) -> None:
    params = dict(model.named_parameters())
    assert all(isinstance(p, DTensor) for p in params.values())
    for name, shape in LOCAL_SHAPES[kind].items():
        assert tuple(params[name].to_local().shape) == shape, name
    q = params["model.layers.0.self_attn.q_proj.weight"]
    placement = dict(zip(q.device_mesh.mesh_dim_names, map(repr, q.placements)))
    if dims.tp > 1:  # FSDP2 over a TP split records its outer split as _StridedShard
        assert placement == {"dp_shard": "_StridedShard(dim=0, sf=2)", "tp": "Shard(dim=0)"}
        o = params["model.layers.0.self_attn.o_proj.weight"]
        assert list(map(repr, o.placements)) == ["Shard(dim=0)", "Shard(dim=1)"]
    else:
        assert placement == {"dp_replicate": "Replicate()", "dp_shard": "Shard(dim=0)"}


def _batches(loader):
    """The loader's indices pick this rank's rows of each step's global batch (the loader holds step 0)."""
    for step in range(NUM_STEPS + 1):
        indices = list(loader.sampler)
        yield global_batch(step)[indices]


def _mesh_worker(rank: int, world_size: int, kind: str, pretrained: str, tmp_dir: str) -> float:
    from transformers import LlamaForCausalLM

    dims = MESHES[kind]
    model, optimizer, loader = _wrapped(rank, world_size, dims, pretrained)
    assert model.advisor_decision.mesh == dims and model.advisor_decision.strategy == "zero3"
    loaded = dict(LlamaForCausalLM.from_pretrained(pretrained).named_parameters())
    assert_params_close(_full(model), loaded, rtol=0, atol=0, label=f"{kind} loaded")
    _assert_placements(model, kind, dims)
    # The loader is split over the dp ranks only: TP ranks of one replica read the same rows.
    assert len(list(loader.sampler)) == GLOBAL_BATCH // dims.dp
    rows = [None] * world_size
    dist.all_gather_object(rows, list(loader.sampler))
    assert sorted(sum(rows[:: dims.tp], [])) == list(range(GLOBAL_BATCH))
    assert rows[rank] == rows[rank - rank % dims.tp]

    train_steps(model, optimizer, itertools.islice(_batches(loader), NUM_STEPS))
    trained = _full(model)
    max_diff = assert_params_close(trained, reference_params(NUM_STEPS), rtol=RTOL, atol=ATOL, label=kind)

    save_checkpoint(model, f"{tmp_dir}/dcp", optimizer=optimizer)
    other, other_optimizer, _ = _wrapped(rank, world_size, dims, None)  # initialised, not loaded
    _assert_initialised(other, dims)
    load_checkpoint(other, f"{tmp_dir}/dcp", optimizer=other_optimizer)
    assert_params_close(_full(other), trained, rtol=0, atol=0, label=f"{kind} restored")
    for each, each_optimizer in ((model, optimizer), (other, other_optimizer)):
        ids = global_batch(NUM_STEPS)[list(loader.sampler)]
        each(input_ids=ids, labels=ids).loss.backward()
        each_optimizer.step()
    assert_params_close(_full(other), _full(model), rtol=0, atol=0, label=f"{kind} continued")
    return max_diff


def _assert_initialised(model, dims: ParallelDims) -> None:
    """Initialised like transformers does (Linear and Embedding N(0, 0.02), norms 1), and every
    replica of a shard holds the same values."""
    full = _full(model)
    assert torch.equal(full["model.norm.weight"], torch.ones(32))
    q = full["model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.std().item() - model.config.initializer_range) < 0.003 and abs(q.mean().item()) < 0.003
    local = model.model.layers[0].self_attn.q_proj.weight.to_local()
    replicas = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(replicas, local)
    rank = dist.get_rank()
    # Rank r ^ 1 differs in the innermost split dimension (tp, or dp_shard under HSDP): another shard.
    assert not torch.equal(replicas[rank], replicas[rank ^ 1])
    if dims.hybrid:  # rank r ^ 2 is the same shard on the other replica: the same values
        assert torch.equal(replicas[rank], replicas[rank ^ 2])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pretrained")
    tiny_llama(0).save_pretrained(path)  # the weights reference_params starts from
    return str(path)


@pytest.fixture(scope="module")
def gloo_runs(pretrained, tmp_path_factory) -> ScenarioResults:
    """Both meshes, run once in one set of 4 gloo processes."""
    scenarios = {kind: (_mesh_worker, kind, pretrained, str(tmp_path_factory.mktemp(kind))) for kind in MESHES}
    return run_scenarios(scenarios, world_size=4, timeout_s=300)


@pytest.mark.parametrize("kind", sorted(MESHES))
def test_mesh_wrap_loads_shards_trains_and_checkpoints(kind, gloo_runs):
    print(f"{kind}: max |diff| {max(gloo_runs.values(kind)):.2e}")
