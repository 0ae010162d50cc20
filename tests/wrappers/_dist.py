"""Run a function in N gloo processes on CPU, with a free port, a deadline and a clean teardown.

``run_distributed(fn, *args)`` spawns ``world_size`` fresh interpreters (``spawn`` start method), each
calling ``fn(rank, world_size, *args)`` inside an initialised gloo process group. ``fn`` must be a
module-level function (it is pickled by name). An exception in any rank fails the caller with that
rank's traceback; a rank that hangs is killed at the deadline and the caller gets ``TimeoutError``.

``run_scenarios({name: (fn, *args), ...})`` runs a module's scenarios in one such spawn (spawning is
the expensive part), each in its own process group, and returns every scenario's per-rank errors: a
module-scoped fixture calls it once and each test asserts its own scenario (``results.check(name)``).

It also holds the workload every wrappers test trains: a tiny Llama built from a config in code,
seeded identically everywhere, and a fixed global batch that ranks split evenly.
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


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple) -> None:
    torch.set_num_threads(1)  # two ranks on a small CPU: do not oversubscribe
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=_COLLECTIVE_TIMEOUT
    )
    try:
        fn(rank, world_size, *args)
        dist.barrier()  # no rank leaves while another still needs it
    finally:
        dist.destroy_process_group()
    # Success: leave without running C++ static destructors. On a 2-core machine gloo's background
    # threads occasionally abort interpreter teardown ("terminate called without an active
    # exception", SIGABRT) after the work has passed. A failure above still raises and is reported.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _collecting_entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple) -> None:
    """``_entry`` that saves what ``fn`` returns to ``args[0]/rank{rank}.pt`` (``args[0]``: a directory)."""
    out_dir, rest = args[0], args[1:]

    def save_result(rank: int, world_size: int, *inner: Any) -> None:
        torch.save(fn(rank, world_size, *inner), os.path.join(out_dir, f"rank{rank}.pt"))

    save_result.__name__ = fn.__name__
    _entry(rank, save_result, world_size, port, rest)


def collect_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout_s: float = 150.0) -> list:
    """``run_distributed``, returning what ``fn`` returned on each rank (torch-saveable), in rank order.
    One spawn can so run several scenarios and the parent assert each in its own test."""
    import tempfile

    with tempfile.TemporaryDirectory() as out_dir:
        _spawn(_collecting_entry, fn, (out_dir, *args), world_size, timeout_s)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def run_distributed(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout_s: float = 150.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; raise if any rank fails or hangs."""
    _spawn(_entry, fn, args, world_size, timeout_s)


def _spawn(entry: Callable[..., None], fn: Callable[..., Any], args: tuple, world_size: int, timeout_s: float) -> None:
    context = mp.start_processes(
        entry, args=(fn, world_size, free_port(), args), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):  # raises ProcessRaisedException if a rank failed
            if time.monotonic() > deadline:
                raise TimeoutError(f"{fn.__name__} did not finish on {world_size} ranks within {timeout_s:.0f}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)


# --- Several scenarios in one spawn -------------------------------------------------------------------
#
# Spawning is the expensive part of a gloo test (two fresh interpreters importing torch and
# transformers: about 10 s of CPU on 2 cores). ``run_scenarios`` spawns one set of processes for a whole
# module and runs each scenario there in its own process group (a fresh group on the same store), with
# torch's seed reset as a fresh interpreter has it, so scenarios see what separate spawns saw. A
# failing scenario is recorded and the next one runs; each test then asserts its own scenario.

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
                    fn(rank, world_size, *args)
                    dist.barrier()  # no rank leaves while another still needs it
                finally:
                    dist.destroy_process_group()
            except BaseException:  # noqa: BLE001 - recorded for the scenario's own test
                error = traceback.format_exc()
            results.write(json.dumps({"name": name, "error": error}) + "\n")
            results.flush()
            gc.collect()
    # Leave without C++ static destructors (see _entry): failures are in the results file.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class ScenarioResults:
    """What each rank reported per scenario; ``check(name)`` fails the calling test with its ranks' errors."""

    def __init__(self, errors: dict[str, dict[int, str]]) -> None:
        self.errors = errors

    def check(self, name: str) -> None:
        failed = self.errors[name]
        if failed:
            report = "\n".join(f"--- rank {rank} ---\n{error}" for rank, error in sorted(failed.items()))
            raise AssertionError(f"scenario {name!r} failed:\n{report}")


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
        except mp.ProcessException as error:  # a rank died outside a scenario (a signal, a C++ abort)
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
    return ScenarioResults(errors)


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


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    """A 2-layer Llama (about 27k parameters), fp32, identical for a given ``seed`` on every rank."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def global_batch(step: int) -> torch.Tensor:
    """Token ids ``[GLOBAL_BATCH, SEQ_LEN]`` for ``step``, the same on every rank."""
    return torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(1000 + step))


def rank_batch(step: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's equal slice of ``global_batch(step)``."""
    per_rank = GLOBAL_BATCH // world_size
    return global_batch(step)[rank * per_rank : (rank + 1) * per_rank]


def build_adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """AdamW with two named groups (no weight decay on 1-D tensors), PyTorch's default foreach kernel."""
    named = list(model.named_parameters())
    return torch.optim.AdamW(
        [
            {"params": [(n, p) for n, p in named if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [(n, p) for n, p in named if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=2e-3,
        betas=(0.9, 0.95),
    )


def reference_params(num_steps: int, *, model_fn: Callable[[], torch.nn.Module] | None = None,
                     batch_fn: Callable[[int], torch.Tensor] | None = None,
                     optimizer_fn: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None,
                     ) -> dict[str, torch.Tensor]:
    """One process, no process group, the whole batch each step: what every strategy must reproduce
    (``tiny_llama``, ``global_batch`` and ``build_adamw`` unless a test trains another workload)."""
    model = (model_fn or tiny_llama)()
    optimizer = (optimizer_fn or build_adamw)(model)
    for step in range(num_steps):
        ids = (batch_fn or global_batch)(step)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach().clone() for name, p in model.named_parameters()}
