"""What a training process holds on the GPU outside PyTorch's caching allocator (what nvidia-smi shows beyond
``max_memory_reserved()``): the CUDA context, the loaded kernels, library handles, NCCL's communicator.

Run (on a machine with one CUDA GPU): python benchmarks/gpu_context.py [--out DIR]
One process, in order: CUDA initialised by one small tensor; then a few training steps of Llama-3.2-1B's config
(random weights, bf16 autocast, SDPA, fused AdamW, micro-batch 1 x 2048 tokens) as the plain model (one GPU, no
process group: what the plan's one-GPU context assumes); then a one-rank NCCL group and an all-reduce (what a
multi-GPU context adds at world size 1: NCCL's buffers for peers are not measurable on one GPU); then the same model
with each block ``torch.compile``d (inductor's kernels). At each point: the device's used memory
(``torch.cuda.mem_get_info``: total - free, every process, the figure nvidia-smi reports), less what was used
before this process touched the GPU, less ``torch.cuda.memory_reserved()``. Writes ``gpu_context.json``.
Exits with code 2 and a message when no CUDA device is available.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy  # noqa: E402

GIB = 2**30


def _smi_used() -> int:
    """Device memory used by every process, as nvidia-smi reports it (MiB), in bytes."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 2**20


def _train(steps: int, *, compile: bool = False) -> None:
    import torch

    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import materialize, resolve_config

    cfg = dict(resolve_config(accuracy.MODELS["llama1b"])[1], use_cache=False, attn_implementation="sdpa")
    net = build_meta_model(cfg)
    materialize(net, device="cuda", real=True)
    net.train()
    if compile:
        from wrappers.compile_float8 import apply_compile

        apply_compile(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, cfg["vocab_size"], (1, 2048), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    del net, opt, loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=accuracy.RESULTS)
    args = parser.parse_args()
    try:
        before = _smi_used()
    except (OSError, subprocess.CalledProcessError):
        before = None
    import torch

    if before is None or not torch.cuda.is_available():
        print("gpu_context: no CUDA device here; run this on a machine with one CUDA GPU", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    rows = []

    def record(point: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        used, smi = total - free - before, _smi_used() - before
        reserved = torch.cuda.memory_reserved()
        rows.append(dict(point=point, used=used, nvidia_smi=smi, reserved=reserved, outside=used - reserved,
                         max_reserved=torch.cuda.max_memory_reserved()))
        print(f"{point:44} used {used / GIB:6.3f}  nvidia-smi {smi / GIB:6.3f}  reserved {reserved / GIB:6.3f}  "
              f"outside the allocator {(used - reserved) / GIB:6.3f} GiB", flush=True)

    torch.zeros(1, device="cuda")
    record("CUDA initialised (one small tensor)")
    _train(3)
    record("after 3 eager training steps, one GPU")
    torch.cuda.empty_cache()
    record("  the same, cache emptied")
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29573", rank=0, world_size=1)
    t = torch.ones(2**20, device="cuda")
    dist.all_reduce(t)
    record("a one-rank NCCL group and an all-reduce")
    _train(3, compile=True)
    record("after 3 steps with each block compiled")
    dist.destroy_process_group()
    import transformers

    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, transformers=transformers.__version__,
                  used_before=before, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_context.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
