"""wrap() checks what it built against what it decided, and fails loudly on a mismatch.

The mismatches are made for real: a process group smaller than the launch, a model wrapped
otherwise than claimed on 2 gloo ranks, and the case found in use, an ``accelerate launch`` with an
FSDP config on a machine without a GPU, where accelerate falls back to one process per rank.
Also: mixed-precision autocast reaches DataParallel replicas, with their own weights and dtype.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from tests.wrappers._dist import ScenarioResults, build_adamw, free_port, global_batch, run_scenarios, tiny_llama
from wrappers import wrap
from wrappers.launch_env import LaunchEnv
from wrappers.precision import apply_autocast, precision_named
from wrappers.recipe import Recipe, apply_recipe
from wrappers.verify import verify_applied

ROOT = Path(__file__).resolve().parents[2]


def _env(world_size: int) -> LaunchEnv:
    return LaunchEnv(world_size=world_size, rank=0, local_rank=0, local_world_size=world_size, num_gpus=0,
                     gpu_name=None, accelerate_plugin=None)


def _without_launch_variables(environ) -> dict[str, str]:
    """``environ`` less what accelerate's launcher and plugins set (``FullyShardedDataParallelPlugin``
    writes ``FSDP_*`` into ``os.environ`` when built, so earlier tests can leave some behind)."""
    return {k: v for k, v in environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}


@pytest.fixture
def clean_launch_environ():
    """``os.environ`` without launch variables for the test, restored afterwards whatever it wrote."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_without_launch_variables(saved))
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def fresh_accelerate(clean_launch_environ):
    """accelerate keeps one process-wide state; each test here starts and ends without one."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


# --- DataParallel and autocast ---------------------------------------------------------------------


def _replica_with_zero_weights(model: torch.nn.Linear) -> torch.nn.Module:
    """What ``torch.nn.parallel.replicate`` builds per GPU: a ``__dict__`` copy whose weights are set
    as plain tensors (here zeros, so a replica that ran the original weights would be caught)."""
    replica = model._replicate_for_data_parallel()
    replica.weight = torch.zeros_like(model.weight)
    replica.bias = torch.zeros_like(model.bias)
    return replica


def test_data_parallel_replica_runs_its_own_weights_under_autocast():
    model = torch.nn.Linear(4, 4)
    apply_autocast(model, "bf16-mixed", "cpu")
    out = _replica_with_zero_weights(model)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16  # autocast reached the replica
    assert torch.count_nonzero(out) == 0  # zero weights: a zero output, not the original module's


def test_replica_in_a_worker_thread_autocasts_to_the_chosen_dtype():
    """``parallel_apply`` runs replicas in threads and re-enters autocast there with the device's
    default dtype (bf16 on CPU, fp16 on CUDA); the replica must still get the precision's dtype."""
    model = torch.nn.Linear(4, 4)
    apply_autocast(model, "fp16-mixed", "cpu")
    replica, result = _replica_with_zero_weights(model), {}

    def worker() -> None:
        with torch.autocast("cpu", enabled=True):  # what parallel_apply's worker does
            result["out"] = replica(torch.ones(2, 4))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result["out"].dtype == torch.float16


def test_precision_named_inverts_the_table():
    assert precision_named(torch.float32, torch.bfloat16) == "bf16-mixed"
    assert precision_named(torch.bfloat16, None) == "bf16"
    with pytest.raises(ValueError, match="float16"):
        precision_named(torch.float16, None)


# --- The torch path ----------------------------------------------------------------------------------


def test_launch_of_two_without_process_group_is_an_error():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2.*no process group"):
        verify_applied(tiny_llama(), None, strategy="ddp", precision="fp32", world_size=2)


def test_wrap_refuses_a_process_group_smaller_than_the_launch():
    """WORLD_SIZE=2, but the script joined a group of one: DDP would synchronise nothing."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="process group has 1"):
            wrap(tiny_llama(), strategy="ddp", env=_env(2), verbose=False)
    finally:
        dist.destroy_process_group()


def test_one_process_precision_is_applied_not_only_recorded():
    model = wrap(tiny_llama(), precision="bf16-mixed", env=_env(1), verbose=False)
    assert model.advisor_decision.precision == "bf16-mixed"
    ids = global_batch(0)
    assert model(input_ids=ids).logits.dtype == torch.bfloat16
    bf16 = tiny_llama().to(torch.bfloat16)
    assert wrap(bf16, env=_env(1), verbose=False).advisor_decision.precision == "bf16"  # not cast up to fp32


def _mismatch_worker(rank: int, world_size: int) -> None:
    model = tiny_llama()
    ddp = apply_recipe(model, Recipe(strategy="ddp"), device="cpu", optimizer=build_adamw(model))
    verify_applied(ddp.model, ddp.optimizer, strategy="ddp", precision="fp32", world_size=world_size)  # true
    cases = [
        (dict(strategy="zero3", precision="fp32"), "not sharded with FSDP2"),
        (dict(strategy="zero1", precision="fp32"), "not a ZeroRedundancyOptimizer"),
        (dict(strategy="ddp", precision="bf16-mixed"), "autocast to None"),
        (dict(strategy="ddp", precision="bf16"), "stored in torch.float32"),
    ]
    for claim, message in cases:
        with pytest.raises(RuntimeError, match=message):
            verify_applied(ddp.model, ddp.optimizer, world_size=world_size, **claim)
    zero3 = apply_recipe(tiny_llama(), Recipe(strategy="zero3", precision="bf16-mixed"), device="cpu")
    verify_applied(zero3.model, None, strategy="zero3", precision="bf16-mixed", world_size=world_size)
    for claim, message in [(dict(strategy="zero3", precision="fp32"), "FSDP2 computes in torch.bfloat16"),
                           (dict(strategy="zero3_offload", precision="bf16-mixed"), "CPU offload is off")]:
        with pytest.raises(RuntimeError, match=message):
            verify_applied(zero3.model, None, world_size=world_size, **claim)
    with pytest.raises(RuntimeError, match="sharded over \\[2\\] ranks, not 4"):
        _verify_fsdp_only(zero3.model, world_size=4)


def _verify_fsdp_only(model: torch.nn.Module, world_size: int) -> None:
    """The sharding check alone (the group check would fire first with a claimed world of 4)."""
    from advisor.strategies import STRATEGIES
    from wrappers.verify import fsdp_problems

    problems = fsdp_problems(model, STRATEGIES["zero3"].on("torch"), world_size, torch.bfloat16)
    if problems:
        raise RuntimeError("; ".join(problems))


def test_wrapping_other_than_claimed_is_an_error_on_two_ranks(gloo_runs):
    gloo_runs.check("mismatch")


def _wrap_ddp_bf16_worker(rank: int, world_size: int) -> None:
    env = LaunchEnv(world_size=world_size, rank=rank, local_rank=rank, local_world_size=world_size, num_gpus=0,
                    gpu_name=None, accelerate_plugin=None)
    model = wrap(tiny_llama(), strategy="ddp", precision="bf16-mixed", env=env, verbose=False)
    assert isinstance(model, DistributedDataParallel)
    ids = global_batch(0)
    assert model(input_ids=ids).logits.dtype == torch.bfloat16  # autocast through the DDP wrapper


def test_wrap_ddp_mixed_precision_passes_its_own_check(gloo_runs):
    gloo_runs.check("ddp_bf16")


@pytest.fixture(scope="module")
def gloo_runs() -> ScenarioResults:
    """The module's 2-rank scenarios, run once in one pair of gloo processes."""
    return run_scenarios({"mismatch": (_mismatch_worker,), "ddp_bf16": (_wrap_ddp_bf16_worker,)})


# --- The accelerate path -----------------------------------------------------------------------------


def test_accelerate_with_fewer_processes_than_the_launch_is_an_error(fresh_accelerate):
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2.*accelerate runs NO on 1"):
        wrap(tiny_llama(), engine="accelerate", env=_env(2), verbose=False)


def test_accelerate_records_the_precision_it_runs(fresh_accelerate, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch --mixed_precision bf16` sets
    model = tiny_llama()
    loader = DataLoader(TensorDataset(global_batch(0)), batch_size=2)
    prepared, _ = wrap(model, loader, engine="accelerate", env=_env(1), verbose=False)
    assert prepared.advisor_accelerator.mixed_precision == "bf16"
    assert prepared.advisor_decision.precision == "bf16-mixed"


_FSDP_SCRIPT = """
import torch
from tests.wrappers._dist import tiny_llama
from wrappers import wrap
wrap(tiny_llama(), torch.optim.SGD(tiny_llama().parameters(), lr=0.1), verbose=False)
print("wrapped without complaint")
"""


def _launch_two(script: str, attempts: int = 2, **launch_env: str) -> list[tuple[int, str, str]]:
    """Run ``script`` as 2 ranks with the variables ``accelerate launch`` sets; (returncode, out, err) each.
    A launch whose ranks never meet (the free port taken by another test's process between ``free_port`` and the
    rendezvous: seen once, under ``bash .ci/drift`` on 2026-11-27), or whose store could not bind that port, is tried
    again on a new port."""
    for attempt in range(attempts):
        port = str(free_port())
        procs = []
        for rank in range(2):
            env = {**_without_launch_variables(os.environ), "PYTHONPATH": str(ROOT), "WORLD_SIZE": "2", "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "OMP_NUM_THREADS": "1", **launch_env}
            procs.append(subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        try:
            outputs = [proc.communicate(timeout=150) for proc in procs]
        except subprocess.TimeoutExpired:
            if attempt + 1 == attempts:
                raise
            continue
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        results = [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]
        port_taken = any(code != 0 and ("Address already in use" in err or "EADDRINUSE" in err)
                         for code, _, err in results)
        if port_taken and attempt + 1 < attempts:
            continue
        return results
    raise AssertionError("unreachable")


def test_accelerate_fsdp_config_without_gpu_fails_loudly_on_every_rank():
    """What ``accelerate launch --config_file fsdp.yaml train.py`` sets, 2 ranks, no GPU."""
    for code, out, err in _launch_two(_FSDP_SCRIPT, ACCELERATE_USE_FSDP="true", ACCELERATE_MIXED_PRECISION="bf16"):
        assert code != 0 and "wrapped without complaint" not in out
        assert "asks for fsdp" in err or "accelerate runs NO on 1" in err, err[-2000:]


_CPU_SCRIPT = """
from tests.wrappers._dist import tiny_llama
from wrappers import wrap
model = wrap(tiny_llama(), engine="accelerate", verbose=False)
d = model.advisor_decision
print(type(model).__name__, d.strategy, d.world_size, d.precision, flush=True)
import os
os._exit(0)  # skip interpreter teardown, where gloo's threads can abort on 2 cores (see _dist.py)
"""


def test_accelerate_cpu_config_on_two_ranks_records_what_runs():
    """A CPU config (ACCELERATE_USE_CPU) with bf16: accelerate runs DDP over 2 processes, autocasting."""
    for code, out, err in _launch_two(_CPU_SCRIPT, ACCELERATE_USE_CPU="true", ACCELERATE_MIXED_PRECISION="bf16"):
        assert code == 0, err[-2000:]
        assert out.split() == ["DistributedDataParallel", "ddp", "2", "bf16-mixed"]


def test_accelerate_plugins_name_their_row_of_the_strategy_table(clean_launch_environ):
    """Plugins as ``accelerate launch`` builds them from a config, read back as strategies by hand:
    FSDP2 resharding + CPU offload is ZeRO-3 offload; FSDP1 SHARD_GRAD_OP is ZeRO-2; DeepSpeed stage 2
    with the optimizer on CPU is zero2_offload; stage 3 offloading only the optimizer has no row."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    from wrappers.prepare_accelerate import accelerate_strategy

    def fsdp(**kwargs):
        return SimpleNamespace(fsdp_plugin=FullyShardedDataParallelPlugin(**kwargs))

    def deepspeed(**kwargs):
        return SimpleNamespace(deepspeed_plugin=DeepSpeedPlugin(**kwargs))

    zero3_offload = fsdp(fsdp_version=2, reshard_after_forward=True, cpu_offload=True)
    assert accelerate_strategy("FSDP", zero3_offload) == "zero3_offload"
    assert accelerate_strategy("FSDP", fsdp(fsdp_version=2, reshard_after_forward=False)) == "zero2"
    assert accelerate_strategy("FSDP", fsdp(fsdp_version=1, reshard_after_forward="SHARD_GRAD_OP")) == "zero2"
    assert accelerate_strategy("FSDP", fsdp(fsdp_version=1, reshard_after_forward="HYBRID_SHARD")) is None
    assert accelerate_strategy("DEEPSPEED", deepspeed(zero_stage=2, offload_optimizer_device="cpu")) == "zero2_offload"
    assert accelerate_strategy("DEEPSPEED", deepspeed(zero_stage=1)) == "zero1"
    assert accelerate_strategy("DEEPSPEED", deepspeed(zero_stage=3, offload_optimizer_device="cpu")) is None
    assert accelerate_strategy("MULTI_CPU", SimpleNamespace()) == "ddp"
    assert accelerate_strategy("NO", SimpleNamespace()) is None


def test_precision_read_back_from_what_accelerate_runs():
    """Plain autocast: the parameters' dtype decides between mixed and pure; DeepSpeed casts the
    module to bf16 and keeps fp32 master weights, which is bf16-mixed in the table."""
    from wrappers.prepare_accelerate import running_precision

    fp32, bf16 = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to(torch.bfloat16)
    assert running_precision(fp32, "bf16", "MULTI_CPU") == "bf16-mixed"
    assert running_precision(fp32, "no", "NO") == "fp32"
    assert running_precision(bf16, "bf16", "MULTI_CPU") == "bf16"
    assert running_precision(bf16, "no", "NO") == "bf16"
    assert running_precision(bf16, "bf16", "DEEPSPEED") == "bf16-mixed"
    with pytest.raises(RuntimeError, match="fp8"):
        running_precision(fp32, "fp8", "MULTI_CPU")


def test_a_model_with_autocast_hooks_deep_copies_and_pickles(tmp_path):
    """EMA copies and whole-model ``torch.save`` keep working, and the copy autocasts too."""
    import copy

    model = apply_autocast(torch.nn.Linear(4, 4), "bf16-mixed", "cpu")
    twin = copy.deepcopy(model)
    assert twin(torch.ones(1, 4)).dtype == torch.bfloat16
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert loaded(torch.ones(1, 4)).dtype == torch.bfloat16
