"""Which ``torch.distributed.pipelining`` schedules train to one-process parity on CPU over gloo.

    python benchmarks/pipeline_schedules_cpu.py gpipe:1 zb_h1:1 zb_h1:2 dualpipev:2

Each ``schedule:stages_per_rank`` runs the workload of ``tests/wrappers/test_pipeline.py`` (pp 2 x
dp 2 = 4 gloo ranks, a 4-layer Llama, 3 AdamW steps, 4 micro-batches per data-parallel rank) through
``wrappers.pipeline.apply_pipeline`` and prints the largest difference from one process training on
the whole batch. The suite runs 1F1B, interleaved 1F1B and ZBV; this script checks the rest
(``wrappers.pipeline.SCHEDULES``' ``cpu_checked``) without spending the suite's time on them.
"""

from __future__ import annotations

import sys
import time

import torch
from tests.wrappers._dist import collect_distributed, reference_params
from tests.wrappers.test_pipeline import DP, MICROBATCHES, NUM_STEPS, PP, _full_params, _train, build_adamw, tiny_llama


def _ranks(rank: int, world_size: int, runs: list[tuple[str, int]]) -> dict:
    from wrappers.pipeline import apply_pipeline, build_pipeline_mesh

    mesh = build_pipeline_mesh(pp=PP, dp_shard=DP, device_type="cpu")
    out = {}
    for schedule, stages in runs:
        start = time.perf_counter()
        pipeline = apply_pipeline(tiny_llama(), mesh, schedule=schedule, virtual_stages=stages,
                                  num_microbatches=MICROBATCHES, device=torch.device("cpu"))
        optimizer = build_adamw(pipeline.rank_model)
        losses = _train(pipeline, optimizer, range(NUM_STEPS), mesh["dp_shard"].get_local_rank())
        out[f"{schedule}:{stages}"] = {"params": _full_params(pipeline), "losses": losses,
                                       "seconds": time.perf_counter() - start}
    return out


def main(args: list[str]) -> None:
    runs = [(arg.split(":")[0], int(arg.split(":")[1])) for arg in args]
    results = collect_distributed(_ranks, runs, world_size=PP * DP, timeout_s=600)
    from tests.wrappers.test_pipeline import global_batch

    reference = reference_params(NUM_STEPS, model_fn=tiny_llama, batch_fn=global_batch)
    for key in results[0]:
        diff = max((r[key]["params"][n] - reference[n]).abs().max().item() for r in results for n in r[key]["params"])
        print(f"{key}: max |diff| {diff:.2e} vs one process; {max(r[key]['seconds'] for r in results):.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
