"""Replay one stored sweep case with its timeline: ``python benchmarks/sweep_case.py ID`` prints the
estimate's moments beside the simulated step segment by segment (MB), to find which moment and which
buffer an error comes from. A mesh row (tp > 1) prints the mesh step's peak by category
(``simulate_mesh`` keeps no timeline), then the timeline of the same job without TP (data parallel
over the world): what a traced family's profile is measured against."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sweep import RESULTS, estimate, load_rows  # noqa: E402
from sweep_report import describe  # noqa: E402

MOMENTS = ("at_start_of_forward", "at_end_of_forward", "at_loss_backward", "at_block_backward",
           "at_end_of_backward", "at_optimizer_step")


def replay(row: dict) -> None:
    from advisor.simulate.step import simulate

    warnings.filterwarnings("ignore")
    case = {k: row[k] for k in ("family", "kind", "config", "job")}
    result, candidate = estimate(case)
    mem = candidate.memory_bytes
    print(describe(row))
    print("estimate:", {k: getattr(mem, k) for k in ("params", "grads", "optimizer", "activations", "temporary")},
          mem.peak_moment, mem.peak_allocated)
    for name in MOMENTS:
        value = getattr(mem, name, None)
        print(f"  {name:22} {'' if value is None else f'{value / 1e6:10.3f} MB'}")
    job = row["job"]
    if job["tp"] > 1:
        from sweep import simulate_case

        mesh = simulate_case(case, result, candidate)
        print("simulated mesh:", mesh["sim_bytes"], mesh["sim_parts"])
        print("without TP (data parallel over the world):")
    mode = "selective" if candidate.selective_checkpointing else result.training.activation_checkpointing
    sim = simulate(dict(row["config"]), world_size=job["world"], strategy=job["strategy"],
                   training=result.training.model_copy(update={"activation_checkpointing": mode}),
                   micro_batch_size=job["micro_batch"], checkpointing=bool(candidate.activation_checkpointing),
                   timeline=True)
    print("simulated:", sim.peak_allocated, sim.peak_phase)
    for seg in sim.timeline.segments:
        p = seg.peak
        print(f"  {seg.phase:14} {seg.label:18} peak {p.total / 1e6:10.3f} MB  (p {p.params / 1e6:.2f} g {p.grads / 1e6:.2f} "
              f"o {p.optimizer / 1e6:.2f} a {p.activations / 1e6:.2f} t {p.temporary / 1e6:.2f})")


if __name__ == "__main__":
    rows = {r["id"]: r for r in load_rows(RESULTS / "sweep.jsonl")}
    replay(rows[sys.argv[1]] if sys.argv[1] in rows else json.loads(sys.argv[1]))
