"""wrap() end to end on CPU: 2 gloo ranks train like one process on the whole batch, the loader is
sharded, the decision is reachable, and one process without a GPU gets its model back unchanged.
The 2-rank strategies run once, in one pair of gloo processes (``gloo_runs``); each test asserts its own."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

from tests.wrappers._dist import (
    ScenarioResults, assert_params_close, batch_loader, build_adamw, launch_env, reference_params, run_scenarios,
    tiny_llama, train_steps,
)
from wrappers import wrap
from wrappers.launch_env import LaunchEnv, read_launch_env

NUM_STEPS = 3
STRATEGIES = [None, "zero1", "zero3"]


def _train_with_wrap(rank: int, world_size: int, strategy: str | None, expected: dict) -> float:
    model = tiny_llama()
    # The sampler gives rank r rows r, r+2, ...: a step's two half-batches together are its global batch,
    # in an interleaved order that leaves the mean loss (and so the gradients) unchanged.
    model, optimizer, loader = wrap(model, build_adamw(model), batch_loader(NUM_STEPS, world_size),
                                    strategy=strategy, env=launch_env(rank, world_size), verbose=rank == 0)
    assert model.advisor_decision.world_size == world_size
    if strategy is not None:
        assert model.advisor_decision.strategy == strategy
    else:
        assert model.advisor_decision.strategy == "ddp" and "< 1B" in model.advisor_decision.reason
    assert len(loader) == NUM_STEPS
    train_steps(model, optimizer, (ids for (ids,) in loader))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # Interleaved rows sum in another order than the reference's: float32 rounding, a few 1e-6.
    return assert_params_close({name: state[name] for name in expected}, expected, rtol=1e-4, atol=1e-5,
                               label=str(strategy))


@pytest.fixture(scope="module")
def gloo_runs() -> ScenarioResults:
    """Every strategy below, run once in one pair of gloo processes."""
    expected = reference_params(NUM_STEPS)
    return run_scenarios({str(strategy): (_train_with_wrap, strategy, expected) for strategy in STRATEGIES})


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_wrap_trains_like_one_process(strategy, gloo_runs):
    print(f"{strategy}: max |diff| {max(gloo_runs.values(str(strategy))):.2e}")


def test_one_process_without_gpu_returns_model_unchanged(capsys):
    model = tiny_llama()
    optimizer = build_adamw(model)
    env = LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=0, gpu_name=None,
                    accelerate_plugin=None)
    same, same_optimizer = wrap(model, optimizer, env=env)
    assert same is model and same_optimizer is optimizer
    assert model.advisor_decision.strategy is None
    # "not parallelised" (it said "unchanged", which a review found misleading beside the precision and checkpointing
    # it names, which wrap() may still apply on one process)
    assert "[advisor] not parallelised (torch, " in capsys.readouterr().err


def test_one_process_refuses_multi_process_strategy():
    env = LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=1, gpu_name="NVIDIA H100 80GB HBM3",
                    accelerate_plugin=None)
    with pytest.raises(ValueError, match="advisor launch"):
        wrap(tiny_llama(), strategy="zero3", env=env)


def test_epoch_loader_reshuffles_per_epoch():
    from wrappers.loader import shard_loader

    loader = DataLoader(TensorDataset(torch.arange(16)), batch_size=2, shuffle=True)
    sharded = shard_loader(loader, num_replicas=2, rank=0)
    first = [b[0].tolist() for b in sharded]
    second = [b[0].tolist() for b in sharded]
    assert len(sum(first, [])) == len(sum(second, [])) == 8 and first != second  # reshuffled per epoch
    assert sharded.epoch == 2


def test_engine_accelerate_returns_what_prepare_returns():
    """engine="accelerate": Accelerator().prepare(...) builds the wrapping; the accelerator is reachable."""
    from accelerate import Accelerator

    model = tiny_llama()
    loader = batch_loader(NUM_STEPS, 2)  # 2 rows a batch
    env = LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=0, gpu_name=None,
                    accelerate_plugin=None)
    prepared_model, prepared_optimizer, prepared_loader = wrap(model, build_adamw(model), loader,
                                                               engine="accelerate", env=env, verbose=False)
    assert isinstance(prepared_model.advisor_accelerator, Accelerator)
    assert prepared_model.advisor_decision.engine == "accelerate"
    (ids,) = next(iter(prepared_loader))
    loss = prepared_model(input_ids=ids, labels=ids).loss
    prepared_model.advisor_accelerator.backward(loss)
    prepared_optimizer.step()


def test_launch_env_reads_accelerate_plugins():
    env = read_launch_env({"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                           "ACCELERATE_USE_FSDP": "true"})
    assert (env.world_size, env.rank, env.nodes, env.accelerate_plugin) == (4, 1, 2, "fsdp")


def test_wrap_of_a_tiny_hf_model_warns_nothing_from_our_code():
    """No Python warning raised from advisor/ or wrappers/, and no transformers deprecation our calls trigger
    (transformers logs those through its own logger, once per process: the cache is cleared first)."""
    import logging
    import warnings
    from pathlib import Path

    from transformers.utils import logging as hf_logging  # defines Logger.warning_once

    ours = tuple(str(Path(__file__).resolve().parents[2] / package) for package in ("advisor", "wrappers"))
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # transformers' warn-once memo: our call must show even if made before
    env = LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=0, gpu_name=None,
                    accelerate_plugin=None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrap(tiny_llama(), env=env, verbose=False)
    finally:
        hf_logger.removeHandler(handler)
    assert [str(w.message) for w in caught if w.filename.startswith(ours)] == []
    assert [r.getMessage() for r in records] == []


_FSDP_EXIT_SCRIPT = """
import atexit, sys
import torch
import torch.distributed as dist
from tests.wrappers._dist import build_adamw, rank_batch, tiny_llama
import wrappers

# Registered before wrap(): atexit runs hooks last-in first-out, so this one sees what wrap()'s left.
atexit.register(lambda: print("group left at exit:", dist.is_initialized(), flush=True))
torch.set_num_threads(1)
model = tiny_llama()
model, optimizer = wrappers.wrap(model, build_adamw(model), strategy="zero3", verbose=False)
for step in range(2):
    ids = rank_batch(step, dist.get_rank(), 2)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if sys.argv[1] == "finish":
    wrappers.finish()
    print("group after finish():", dist.is_initialized(), flush=True)
    wrappers.finish()  # a second call does nothing
"""


_CRASH_SCRIPT = """
import time
import torch
import torch.distributed as dist
from wrappers.launch_env import read_launch_env
from wrappers.process_group import init_launch_group

init_launch_group(read_launch_env())
if dist.get_rank() == 1:
    raise RuntimeError("rank 1 fails before its first collective")
dist.all_reduce(torch.ones(4))  # rank 0 waits in a collective rank 1 never joins
"""


def test_a_rank_that_fails_does_not_hang_the_others():
    """Rank 1 raises while rank 0 waits in an all-reduce: the failing rank destroys its group at exit without
    waiting for the others (``destroy_at_exit``), so rank 0's collective fails and both exit, nonzero, in seconds
    (waiting first, as a normal exit does, hung them until the group's own timeout)."""
    import time

    from tests.wrappers.test_verify import _launch_two

    start = time.perf_counter()
    (code0, _, err0), (code1, _, err1) = _launch_two(_CRASH_SCRIPT)
    assert code1 != 0 and "rank 1 fails before its first collective" in err1
    assert code0 != 0, err0[-2000:]
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("ending", ["finish", "exit"])
def test_fsdp2_on_two_gloo_ranks_tears_down_its_process_group(ending):
    """A 2-rank FSDP2 script ends with exit status 0 and no process group left: after ``wrappers.finish()``
    (the documented last call) or, without it, destroyed at exit by wrap(). Left to the interpreter's
    teardown, gloo's threads aborted 3 of 10 such runs (SIGABRT) after training had finished."""
    from tests.wrappers.test_verify import _launch_two

    script = _FSDP_EXIT_SCRIPT.replace("sys.argv[1]", repr(ending))
    for code, out, err in _launch_two(script):
        assert code == 0, err[-2000:]
        assert "group left at exit: False" in out, out
        if ending == "finish":
            assert "group after finish(): False" in out, out


def test_an_optimizer_name_or_an_unknown_precision_is_one_value_error():
    """A fuzz round: wrap(model, "adamw") raised an AttributeError from reading the optimizer's defaults, and
    wrap(precision="fp8") a pydantic dump; both now name the argument."""
    env = LaunchEnv(world_size=1, rank=0, local_rank=0, local_world_size=1, num_gpus=0, gpu_name=None,
                    accelerate_plugin=None)
    with pytest.raises(ValueError, match="optimizer: expected a torch.optim.Optimizer .* got str"):
        wrap(tiny_llama(), "adamw", env=env)
    with pytest.raises(ValueError, match="precision: expected one of fp32, bf16-mixed, fp16-mixed, bf16, got 'fp8'"):
        wrap(tiny_llama(), precision="fp8", env=env)
