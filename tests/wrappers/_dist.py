"""Run a function in N gloo processes on CPU, with a free port, a deadline and a clean teardown.

``run_scenarios({name: (fn, *args), ...})`` starts ``world_size`` ranks once (spawning is the expensive
part) and runs each scenario there in its own gloo process group, calling ``fn(rank, world_size, *args)``;
it returns every scenario's per-rank errors and return values: a module-scoped fixture calls it once and
each test asserts its own scenario (``results.check(name)``, ``results.values(name)``).
``run_distributed(fn, *args)`` and ``collect_distributed(fn, *args)`` are the one-scenario cases (raise on
a rank's error; the latter returns what ``fn`` returned on each rank). ``fn`` must be a module-level
function (it is pickled by name); a rank that hangs is killed at the deadline and reported.

It also holds the workload every wrappers test trains and the comparison they make: a tiny Llama built
from a config in code, seeded identically everywhere, a fixed global batch that ranks split evenly,
AdamW with two groups, ``train_steps`` (K steps, the losses), ``reference_run`` (the same on one process,
no process group, the whole batch) and ``assert_params_close`` (allclose per tensor, the max |diff|).
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Collective timeout inside the workers; the whole run has its own deadline (``timeout_s``).
_COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)


def free_port() -> int:
    """A TCP port that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout_s: float = 150.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; raise if any rank fails or hangs."""
    run_scenarios({fn.__name__: (fn, *args)}, world_size=world_size, timeout_s=timeout_s).check(fn.__name__)


def collect_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout_s: float = 150.0) -> list:
    """``run_distributed``, returning what ``fn`` returned on each rank (torch-saveable), in rank order."""
    results = run_scenarios({fn.__name__: (fn, *args)}, world_size=world_size, timeout_s=timeout_s)
    return results.values(fn.__name__)


# --- Several scenarios in one spawn -------------------------------------------------------------------
#
# Spawning is the expensive part of a gloo test (two fresh interpreters importing torch and
# transformers: about 10 s of CPU on 2 cores). ``run_scenarios`` spawns one set of processes for a whole
# module and runs each scenario there in its own process group (a fresh group on the same store), with
# torch's seed reset as a fresh interpreter has it, so scenarios see what separate spawns saw. A
# failing scenario is recorded and the next one runs; each test then asserts its own scenario. What a
# scenario returns (anything torch.save takes) comes back to the parent too.

# What the fork server imports once (it is started on the first call, before any rank).
_PRELOAD = ["torch", "torch.distributed", "transformers", "transformers.models.llama.modeling_llama", "tests.wrappers._dist"]
# torch's default seed in a fresh interpreter (torch/csrc: default_rng_seed_val).
_FRESH_TORCH_SEED = 67280421310721


def _scenario_entry(rank: int, scenarios: list, world_size: int, port: int, result_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=_COLLECTIVE_TIMEOUT)
    with open(f"{result_dir}/rank{rank}.jsonl", "a", encoding="utf-8") as results:
        for index, (name, fn, args) in enumerate(scenarios):
            torch.manual_seed(_FRESH_TORCH_SEED)
            error = None
            try:
                dist.init_process_group("gloo", store=dist.PrefixStore(f"scenario{index}", store), rank=rank,
                                        world_size=world_size, timeout=_COLLECTIVE_TIMEOUT)
                try:
                    value = fn(rank, world_size, *args)
                    if value is not None:
                        torch.save(value, f"{result_dir}/{index}-rank{rank}.pt")
                    dist.barrier()  # no rank leaves while another still needs it
                finally:
                    dist.destroy_process_group()
            except BaseException:  # noqa: BLE001 - recorded for the scenario's own test
                error = traceback.format_exc()
            results.write(json.dumps({"name": name, "error": error}) + "\n")
            results.flush()
            gc.collect()
    # Success or not, leave without running C++ static destructors: on a 2-core machine gloo's background
    # threads occasionally abort interpreter teardown ("terminate called without an active exception",
    # SIGABRT) after the work has passed. Failures are in the results file.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class ScenarioResults:
    """What each rank reported per scenario; ``check(name)`` fails the calling test with its ranks' errors,
    ``values(name)`` checks and returns what the scenario's function returned on each rank, in rank order."""

    def __init__(self, errors: dict[str, dict[int, str]], returned: dict[str, list] | None = None) -> None:
        self.errors = errors
        self.returned = returned or {}

    def check(self, name: str) -> None:
        failed = self.errors[name]
        if failed:
            report = "\n".join(f"--- rank {rank} ---\n{error}" for rank, error in sorted(failed.items()))
            raise AssertionError(f"scenario {name!r} failed:\n{report}")

    def values(self, name: str) -> list:
        self.check(name)
        return self.returned[name]


def run_scenarios(
    scenarios: dict[str, tuple], *, world_size: int = 2, timeout_s: float = 150.0
) -> ScenarioResults:
    """Run every ``name: (fn, *args)`` of ``scenarios`` in one set of ``world_size`` gloo ranks, each in
    its own process group; ``timeout_s`` bounds each scenario (a hang is killed and reported)."""
    items = [(name, entry[0], tuple(entry[1:])) for name, entry in scenarios.items()]
    # Ranks are forked from one server process that imported torch and transformers once for the
    # whole session (a fresh interpreter each, as under spawn, without paying the imports each time).
    mp.set_forkserver_preload(_PRELOAD)
    with tempfile.TemporaryDirectory(prefix="scenarios-") as result_dir:
        context = mp.start_processes(_scenario_entry, args=(items, world_size, free_port(), result_dir),
                                     nprocs=world_size, join=False, start_method="forkserver")
        died = None
        deadline, seen = time.monotonic() + timeout_s, 0
        try:
            while not context.join(timeout=1.0):
                done = sum(len(_read_results(result_dir, r)) for r in range(world_size))
                if done != seen:  # progress: the next scenario gets its own time
                    deadline, seen = time.monotonic() + timeout_s, done
                if time.monotonic() > deadline:
                    died = f"timed out: no scenario finished within {timeout_s:.0f}s"
                    break
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:  # a rank died outside a scenario
            died = f"a rank exited early: {error}"
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join(timeout=5)
        errors: dict[str, dict[int, str]] = {name: {} for name, _, _ in items}
        for rank in range(world_size):
            reported = _read_results(result_dir, rank)
            for name, _, _ in items:
                if name not in reported:
                    errors[name][rank] = died or "the rank ended before this scenario"
                elif reported[name] is not None:
                    errors[name][rank] = reported[name]
        returned = {name: [_load_value(result_dir, index, rank) for rank in range(world_size)]
                    for index, (name, _, _) in enumerate(items) if not errors[name]}
    return ScenarioResults(errors, returned)


def _load_value(result_dir: str, index: int, rank: int) -> Any:
    path = f"{result_dir}/{index}-rank{rank}.pt"
    return torch.load(path, weights_only=False) if os.path.exists(path) else None


def _read_results(result_dir: str, rank: int) -> dict[str, str | None]:
    try:
        with open(f"{result_dir}/rank{rank}.jsonl", encoding="utf-8") as results:
            lines = [json.loads(line) for line in results if line.endswith("\n")]
    except FileNotFoundError:
        return {}
    return {line["name"]: line["error"] for line in lines}


GLOBAL_BATCH = 4
SEQ_LEN = 16
VOCAB = 128


def tiny_llama(seed: int = 0, *, num_layers: int = 2, hidden_size: int = 32, tie: bool = False) -> torch.nn.Module:
    """A Llama of ``num_layers`` layers (2 x 32 by default: about 27k parameters), MLP twice the hidden
    size, 4 heads, 2 key/value heads, fp32, identical for a given ``seed`` on every rank."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        use_cache=False, tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def global_batch(step: int, batch_size: int = GLOBAL_BATCH) -> torch.Tensor:
    """Token ids ``[batch_size, SEQ_LEN]`` for ``step``, the same on every rank."""
    return torch.randint(0, VOCAB, (batch_size, SEQ_LEN), generator=torch.Generator().manual_seed(1000 + step))


def rank_batch(step: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's equal slice of ``global_batch(step)``."""
    per_rank = GLOBAL_BATCH // world_size
    return global_batch(step)[rank * per_rank : (rank + 1) * per_rank]


def batch_loader(num_steps: int, world_size: int):
    """A ``DataLoader`` over ``num_steps`` global batches, ``GLOBAL_BATCH // world_size`` rows a batch: step
    k's global batch is rows [k*GLOBAL_BATCH, (k+1)*GLOBAL_BATCH). Under ``wrap()`` the sampler gives rank r
    rows r, r + world_size, ...: a step's rank batches together are its global batch, interleaved."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.cat([global_batch(step) for step in range(num_steps)]))
    return DataLoader(data, batch_size=GLOBAL_BATCH // world_size, shuffle=False)


def launch_env(rank: int, world_size: int):
    """What a launcher's environment says to ``wrap()`` on ``rank`` of ``world_size`` CPU processes."""
    from wrappers.launch_env import read_launch_env

    return read_launch_env({"WORLD_SIZE": str(world_size), "RANK": str(rank), "LOCAL_RANK": str(rank)})


def build_adamw(model: torch.nn.Module, *, named: bool = True) -> torch.optim.AdamW:
    """AdamW with two groups (no weight decay on 1-D tensors), PyTorch's default foreach kernel; the
    groups hold (name, parameter) pairs unless ``named`` is False."""
    named_params = list(model.named_parameters())

    def group(params: list) -> list:
        return params if named else [p for _, p in params]

    return torch.optim.AdamW(
        [
            {"params": group([(n, p) for n, p in named_params if p.ndim >= 2]), "weight_decay": 0.1},
            {"params": group([(n, p) for n, p in named_params if p.ndim < 2]), "weight_decay": 0.0},
        ],
        lr=2e-3,
        betas=(0.9, 0.95),
    )


def train_steps(model: Any, optimizer: torch.optim.Optimizer, batches: Any) -> list[float | None]:
    """One optimizer step per batch of token ids (the labels are the ids); the losses, in order.
    ``model`` is a causal LM (forward, backward here) or a ``wrappers.pipeline.Pipeline``, whose
    ``step`` runs forward and backward and returns the loss on the last stage only (None elsewhere)."""
    losses: list[float | None] = []
    for ids in batches:
        if isinstance(model, torch.nn.Module):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        else:
            loss = model.step(ids)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(None if loss is None else loss.item())
    return losses


class Reference:
    """One process's training: its final parameters and its losses."""

    def __init__(self, params: dict[str, torch.Tensor], losses: list[float]) -> None:
        self.params, self.losses = params, losses


def reference_run(num_steps: int, *, model_fn: Callable[[], torch.nn.Module] | None = None,
                  batch_fn: Callable[[int], torch.Tensor] | None = None,
                  optimizer_fn: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None) -> Reference:
    """One process, no process group, the whole batch each step: what every strategy must reproduce
    (``tiny_llama``, ``global_batch`` and ``build_adamw`` unless a test trains another workload)."""
    model = (model_fn or tiny_llama)()
    optimizer = (optimizer_fn or build_adamw)(model)
    losses = train_steps(model, optimizer, ((batch_fn or global_batch)(step) for step in range(num_steps)))
    return Reference({name: p.detach().clone() for name, p in model.named_parameters()}, losses)


def reference_params(num_steps: int, *, model_fn: Callable[[], torch.nn.Module] | None = None,
                     batch_fn: Callable[[int], torch.Tensor] | None = None,
                     optimizer_fn: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None,
                     ) -> dict[str, torch.Tensor]:
    """``reference_run``'s final parameters."""
    return reference_run(num_steps, model_fn=model_fn, batch_fn=batch_fn, optimizer_fn=optimizer_fn).params


def max_abs_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest |got - want| over the tensors of ``got`` (each must be in ``want``)."""
    return max((got[name] - want[name]).abs().max().item() for name in got)


def assert_params_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], *, rtol: float, atol: float,
                        label: str = "") -> float:
    """``torch.testing.assert_close`` on every tensor of ``got`` against the same name in ``want`` (the
    failure names the tensor after ``label``); returns the max |diff| for the test to report."""
    for name, value in got.items():
        torch.testing.assert_close(value, want[name], rtol=rtol, atol=atol, msg=lambda m: f"{label} {name}: {m}")
    return max_abs_diff(got, want)
