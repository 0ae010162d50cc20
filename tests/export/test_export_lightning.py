"""The Lightning export (issue 10, item 6): FSDP2 through ``ModelParallelStrategy``, as the header says,
with blocks matched by class name; executed for real with Lightning.

Before this, the file used Lightning's FSDP1 ``FSDPStrategy`` under a header saying FSDP2, and for
Llava imported ``LlamaDecoderLayer`` from ``modeling_llava`` (ImportError). Here the exported file is
executed: a two-rank gloo ``Trainer.fit`` on a tiny Llama (Lightning launches the second rank), and
its ``shard_model`` on a tiny Llava in a two-rank gloo group. The ``shard_model`` scenarios run once,
in one pair of gloo processes (``gloo_runs``); each test asserts its own.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from export_plans import PLANS, make_plan

from advisor.export import ExportOptions
from advisor.export.lightning import build_lightning
from advisor.planning.api import plan
from tests.wrappers._dist import ScenarioResults, run_scenarios

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "lightning_fit_script.py"
FIT_TIMEOUT_S = 240

TINY_LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  intermediate_size=64, vocab_size=100, architectures=["LlamaForCausalLM"])
LLAVA_TEXT = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=128, vocab_size=1000, tie_word_embeddings=False)
LLAVA_VISION = dict(model_type="clip_vision_model", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, image_size=32, patch_size=8)


def _llava_config() -> transformers.LlavaConfig:
    return transformers.LlavaConfig(text_config=LLAVA_TEXT, vision_config=LLAVA_VISION, image_token_index=999,
                                    architectures=["LlavaForConditionalGeneration"])


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(**TINY_LLAMA).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava")
    _llava_config().save_pretrained(path)
    return str(path)


def _llava_source(llava_dir: str) -> str:
    return build_lightning(plan(llava_dir, "2xA100", strategy="zero3"))


@pytest.fixture(scope="module")
def gloo_runs(llama_dir, llava_dir) -> ScenarioResults:
    """The exported ``shard_model`` of the Llava plan below on 2 ranks, in the session's gloo processes (the
    HSDP snippet runs in this process on torch's fake process group: ``_shard_hybrid``)."""
    return run_scenarios({"llava": (_shard_llava, _llava_source(llava_dir))})


def _calls(source: str) -> dict[str, dict[str, str]]:
    """Call name -> {keyword: source text} for every call by plain name in the snippet."""
    calls = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls[node.func.id] = {kw.arg: ast.unparse(kw.value) for kw in node.keywords}
    return calls


@pytest.mark.parametrize("name,cls,expected,precision", [
    ("qwen7b_2xa100_zero3", "ModelParallelStrategy", {"data_parallel_size": "2", "tensor_parallel_size": "1"},
     "'32-true'"),
    ("qwen05b_ddp", "DDPStrategy", {}, "'bf16-mixed'"),
    ("qwen7b_deepspeed_zero2_offload", "DeepSpeedStrategy", {"stage": "2", "offload_optimizer": "True",
                                                             "offload_parameters": "False"}, "'bf16-mixed'"),
    # 2 nodes x 8 GPUs: one data-parallel dimension of 16 ranks; HSDP's (2, 8) mesh is built in shard_model.
    ("qwen72b_2nodes", "ModelParallelStrategy", {"data_parallel_size": "16", "tensor_parallel_size": "1"},
     "'32-true'"),
])
def test_snippet_is_python_with_the_right_strategy(name, cls, expected, precision):
    plan_ = make_plan(**PLANS[name])
    source = build_lightning(plan_)
    calls = _calls(source)
    assert calls[cls] == expected
    trainer = calls["Trainer"]
    assert trainer["devices"] == str(plan_.hardware.gpus_per_node) and trainer["num_nodes"] == str(plan_.hardware.nodes)
    assert trainer["precision"] == precision
    assert "from transformers" not in source  # blocks are matched by name: nothing to import


@pytest.mark.parametrize("strategy,reshard,offload", [
    ("zero2", False, False), ("zero3", True, False), ("zero2_offload", False, True), ("zero3_offload", True, True),
])
def test_sharded_torch_strategies_run_fsdp2_as_the_header_says(strategy, reshard, offload):
    source = build_lightning(make_plan("Qwen/Qwen2.5-0.5B", strategy=strategy))
    header = source.splitlines()[0]
    assert f"(FSDP2 fully_shard(reshard_after_forward={reshard}" in header
    assert "FSDPStrategy" not in source and "FullyShardedDataParallel" not in source  # FSDP1
    assert "strategy = ModelParallelStrategy(" in source and "fully_shard(block, **options)" in source
    assert f"reshard_after_forward={reshard}," in source
    assert ("offload_policy=CPUOffloadPolicy()," in source) is offload
    # bf16-mixed (the default): the MixedPrecisionPolicy of wrappers.fsdp, fp32 parameters in the Trainer.
    assert "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)," in source


def _executable(source: str) -> str:
    """The exported file as it would run here: no GPU, so the Trainer is asked for the CPU."""
    assert source.count('accelerator="gpu"') == 1
    return source.replace('accelerator="gpu"', 'accelerator="cpu"')


def _shard_llava(rank: int, world_size: int, source: str) -> None:
    """The exported shard_model on a tiny Llava over all ranks: the language model's blocks and the CLIP
    tower's layers are units; one image (32 x 32 pixels of 8 x 8 patches: 16 image tokens) runs the tower."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    namespace: dict = {}
    exec(source.split("\nstrategy = ")[0], namespace)  # the imports and shard_model; no Trainer in a worker
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(_llava_config())
    mesh = init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    namespace["shard_model"](model, mesh)
    units = sorted(type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule))
    assert units == ["FSDPCLIPEncoderLayer", "FSDPCLIPEncoderLayer", "FSDPLlamaDecoderLayer", "FSDPLlamaDecoderLayer",
                     "FSDPLlavaForConditionalGeneration"], units
    ids = torch.randint(0, 900, (1, 24), generator=torch.Generator().manual_seed(rank))
    ids[:, 4:20] = 999  # the image's placeholder tokens
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, pixel_values=pixels, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.model.language_model.parameters())
    # The last CLIP layer runs but feeds nothing (vision_feature_layer -2): only the first gets gradients.
    assert all(p.grad is not None for p in model.model.vision_tower.encoder.layers[0].parameters())


def test_llava_export_imports_and_shards_the_language_and_vision_blocks(llava_dir, gloo_runs):
    source = _llava_source(llava_dir)
    assert 'BLOCK_CLASSES = ("LlamaDecoderLayer", "CLIPEncoderLayer")' in source and "modeling_llava" not in source
    namespace: dict = {}
    exec(_executable(source), namespace)  # the old file raised ImportError here
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert isinstance(namespace["trainer"].strategy, ModelParallelStrategy)
    gloo_runs.check("llava")  # _shard_llava on this source


def _fit(tmp_path: Path, source: str, model_dir: str) -> list[str]:
    """Each rank's line after a two-rank ``Trainer.fit`` under the exported file. A failed launch is tried once more
    in a fresh folder, with a warning that carries the first failure: one full-suite run under load failed a launch
    once (its output was not kept; it passed on every rerun), and two gloo processes started by Lightning's own
    launcher are the part of these tests that depends on the machine (a port, a rendezvous). A second failure fails."""
    failures = []
    for attempt in (1, 2):
        folder = tmp_path / f"attempt{attempt}"
        folder.mkdir()
        exported = folder / "lightning_strategy.py"
        exported.write_text(source)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, str(SCRIPT), str(exported), model_dir], capture_output=True, text=True,
                              timeout=FIT_TIMEOUT_S, cwd=folder, env=env)
        if done.returncode == 0:
            if failures:
                warnings.warn(f"the first two-rank Lightning launch failed, the second passed: {failures[0]}")
            return [path.read_text().strip() for path in sorted(folder.glob("rank*.txt"))]
        failures.append(f"rc {done.returncode}: {done.stdout[-3000:]}{done.stderr[-3000:]}")
    pytest.fail("\n\n".join(failures))


@pytest.mark.parametrize("options,expected", [
    # bf16-mixed: fp32 sharded parameters, bf16 all-gathers and compute (MixedPrecisionPolicy).
    (dict(strategy="zero3", activation_checkpointing="on"),
     "units=FSDPCheckpointWrapper,FSDPCheckpointWrapper,FSDPLlamaForCausalLM meshes=[2] stored=torch.float32 "
     "param_dtype=torch.bfloat16"),
    # Selective: the same units, each wrapper recomputing under wrappers.checkpointing's per-op policy.
    (dict(strategy="zero3", activation_checkpointing="selective"),
     "units=FSDPCheckpointWrapper,FSDPCheckpointWrapper,FSDPLlamaForCausalLM meshes=[2] stored=torch.float32 "
     "param_dtype=torch.bfloat16"),
    # Pure bf16: the model is cast before sharding, no policy, and Lightning's bf16-true leaves it so.
    (dict(strategy="zero2", precision="bf16", activation_checkpointing="off"),
     "units=FSDPLlamaDecoderLayer,FSDPLlamaDecoderLayer,FSDPLlamaForCausalLM meshes=[2] stored=torch.bfloat16 "
     "param_dtype=None"),
])
def test_exported_fsdp2_strategy_trains_on_two_gloo_ranks(tmp_path, llama_dir, options, expected):
    """Each rank holds half of every parameter; blocks (checkpointed when planned) are the FSDP units."""
    source = build_lightning(plan(llama_dir, "2xA100", **options))
    assert ("context_fn=selective_context" in source) == (options["activation_checkpointing"] == "selective")
    lines = _fit(tmp_path, source, llama_dir)
    assert lines == [f"rank={r} world=2 {expected} steps=2" for r in (0, 1)]


def test_exported_cpu_ddp_strategy_trains_on_two_gloo_ranks(tmp_path, llama_dir):
    source = build_lightning(plan(llama_dir, "2xA100"), ExportOptions(cpu=True, processes=2))
    assert _calls(source)["Trainer"]["precision"] == "'32-true'"
    lines = _fit(tmp_path, source, llama_dir)
    assert lines == [f"rank={r} world=2 units= meshes=[] stored=torch.float32 param_dtype= steps=2" for r in (0, 1)]


def _shard_hybrid(source: str, world_size: int) -> set:
    """HSDP: run the exported shard_model on a 4-rank mesh in this process (torch's fake process group: the
    mesh and placements are built as on 4 ranks, no collective runs); the placements of its parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tests.wrappers._dist import tiny_llama

    namespace: dict = {}
    exec(source.split("\nstrategy = ")[0], namespace)
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        model = tiny_llama()
        lightning_mesh = init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        namespace["shard_model"](model, lightning_mesh)
        return {(p.device_mesh.mesh_dim_names, tuple(p.device_mesh.shape), p.placements) for p in model.parameters()
                if isinstance(p, DTensor)}
    finally:
        dist.destroy_process_group()


def test_hybrid_export_shards_within_a_node_and_replicates_across(llama_dir):
    from torch.distributed.tensor import Replicate, Shard

    # 2 nodes x 2 GPUs with --hybrid 2: the plan's mesh is dp_replicate 2 x dp_shard 2, and the snippet builds it.
    hsdp = plan(llama_dir, "2xA100", nodes=2, strategy="zero3", hybrid=2)
    assert hsdp.recommendation.mesh.label == "dp_replicate 2 x dp_shard 2"
    source = build_lightning(hsdp)
    assert 'init_device_mesh(device_mesh.device_type, (2, 2), mesh_dim_names=("replicate", "shard"))' in source
    assert _shard_hybrid(source, 4) == {(("replicate", "shard"), (2, 2), (Replicate(), Shard(0)))}


def test_exported_checkpointing_turns_the_kv_cache_off(llama_dir):
    """torch's checkpoint_wrapper leaves a Hugging Face model's config.use_cache on, and the cache then holds every
    layer's K/V to the last block's backward (advisor.estimate.kv_cache): the exported shard_model turns it off
    before wrapping, as wrap() does. Run on a 2-rank fake process group (no collective runs)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tests.wrappers._dist import tiny_llama

    source = build_lightning(plan(llama_dir, "2xA100", strategy="zero3", activation_checkpointing="on"))
    namespace: dict = {}
    exec(source.split("\nstrategy = ")[0], namespace)
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        model = tiny_llama()
        model.config.use_cache = True  # as from_pretrained loads a Llama / Qwen2 config
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        namespace["shard_model"](model, mesh)
    finally:
        dist.destroy_process_group()
    assert model.config.use_cache is False
