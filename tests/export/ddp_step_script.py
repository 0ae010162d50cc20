"""Launched by test_export_launch.py under `accelerate launch` with an exported CPU config.

Each rank joins a gloo process group from the launcher's environment (through accelerate's
``Accelerator`` when ``ACCELERATE_USE_CPU`` is set, as ``advisor launch`` does), takes one DDP step on a
tiny model wrapped by ``wrappers.wrap()`` and checks that the gradients were averaged (equal on
every rank). It prints the strategy ``wrap()`` chose (DDP for this small model on two processes).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def _model(rank: int) -> torch.nn.Module:
    torch.manual_seed(0)  # same weights everywhere
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def main() -> int:
    torch.set_num_threads(1)
    via = "torch"
    if os.environ.get("ACCELERATE_USE_CPU") == "true":  # set by `advisor launch` for a CPU config
        from accelerate import Accelerator

        accelerator = Accelerator()  # reads ACCELERATE_USE_CPU and joins a gloo group itself
        via = f"accelerate:{accelerator.distributed_type.value}x{accelerator.num_processes}"
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model(rank)
    from wrappers import wrap

    model = wrap(model, verbose=False)
    how = f"wrappers.wrap strategy={model.advisor_decision.strategy}"
    torch.manual_seed(100 + rank)  # different data on each rank
    inputs, targets = torch.randn(4, 8), torch.randn(4, 1)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grad) for _ in range(world)]
    dist.all_gather(gathered, grad)
    same = all(torch.equal(gathered[0], g) for g in gathered)
    line = (f"rank {rank}/{world} {how} step ok={same} loss={loss.item():.4f} "
            f"mixed_precision={os.environ.get('ACCELERATE_MIXED_PRECISION')} group={via}\n")
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode())  # one write: the ranks share stdout, lines must not interleave
    dist.barrier()
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without running C++ static destructors: on a 2-core machine gloo's background threads
    # occasionally abort interpreter teardown ("terminate called without an active exception"),
    # after the step has succeeded. The process group is already destroyed.
    os._exit(code)
