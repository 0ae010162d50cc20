"""Step time of a wrap()-ed model against hand-written DDP / FSDP2 code, same CPU job.

Run: python benchmarks/wrap_overhead.py [--steps 20] [--repeat 3]
Two gloo ranks on CPU train a small Llama (4 layers, hidden 256) with AdamW; each measurement is a
fresh pair of processes running ``--steps`` timed steps after 3 warm-up steps (per-step median),
``--repeat`` times per variant, alternating which goes first; the median of each variant is
printed with the ratio wrapped / hand-written (goal: at most 1.02).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=2048, use_cache=False)
    return LlamaForCausalLM(config)


def _by_hand(strategy: str, model: torch.nn.Module):
    if strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=False)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _wrapped(strategy: str, model: torch.nn.Module):
    from wrappers import wrap

    return wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-4), strategy=strategy, precision="fp32",
                verbose=False)


def _time_steps(model, optimizer, steps: int, rank: int) -> float:
    """Median seconds per step over ``steps`` steps after 3 warm-up steps (the median resists load spikes)."""
    ids = torch.randint(0, 2048, (4, 256), generator=torch.Generator().manual_seed(rank))
    times = []
    for i in range(3 + steps):
        dist.barrier()
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.barrier()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank: int, world: int, port: int, strategy: str, label: str, steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    build = _wrapped if label == "wrap" else _by_hand
    model, optimizer = build(strategy, _model())
    seconds = _time_steps(model, optimizer, steps, rank)
    if rank == 0:
        queue.put(seconds)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(strategy: str, label: str, steps: int) -> float:
    """One fresh pair of processes per measurement: no state carried over between variants."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(2, _free_port(), strategy, label, steps, queue), nprocs=2,
                       start_method="spawn")
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for strategy in ("ddp", "zero3"):
        results: dict[str, list[float]] = {"hand": [], "wrap": []}
        for i in range(args.repeat):
            for label in ("hand", "wrap") if i % 2 == 0 else ("wrap", "hand"):  # alternate who goes first
                results[label].append(_run(strategy, label, args.steps))
        hand, wrapped = statistics.median(results["hand"]), statistics.median(results["wrap"])
        print(f"{strategy:>5}: hand-written {hand * 1000:7.1f} ms/step  wrap() {wrapped * 1000:7.1f} ms/step  "
              f"ratio {wrapped / hand:.3f}  (goal <= 1.02; runs: hand "
              f"{', '.join(f'{t * 1000:.0f}' for t in results['hand'])}; wrap "
              f"{', '.join(f'{t * 1000:.0f}' for t in results['wrap'])} ms)")


if __name__ == "__main__":
    main()
