"""A randomized sweep of the analytic estimate against the fake-tensor simulator (issue 20).

Run: python benchmarks/sweep.py [--seed N] [--cases N] [--budget-s S] [--out FILE] [--reestimate] [--rerun ID ...]

Draws ``--cases`` random jobs (``benchmarks/sweep_cases.py``: tiny configs of formula and traced
families, every simulated strategy and mesh, lengths 128-8192, checkpointing off/on/selective,
LoRA/DoRA, loss kernels, precisions, optimizers), and for each one plans it as ``advisor plan`` does
(``advisor.plan`` with the strategy, micro-batch and checkpointing pinned; traced families trace) and
runs the step PyTorch executes (``advisor.simulate.verify.verify``, i.e. ``advisor simulate``; meshes
through ``advisor.simulate.mesh_step.simulate_mesh``). One JSON line per case is appended to
``--out`` (default benchmarks/results/sweep.jsonl); a case already there (same content hash) is
skipped, so an interrupted sweep resumes where it stopped and a seed can be replayed. A progress bar
runs on stderr; ``--budget-s`` stops drawing new cases after that many seconds.

Then the summary: median, p90 and max |error| per group (strategy, checkpointing, LoRA, family kind,
precision, loss) and the worst cases with the peak moment of both sides, printed and written to
benchmarks/results/sweep_summary.md (``--summary``). ``--reestimate`` recomputes the analytic side of
every stored row (the simulated side does not depend on the estimator) before summarising: after a fix
of the estimate, the whole sweep is re-scored in seconds. ``--rerun ID ...`` plans and simulates the
listed stored cases again, after a fix of the simulator.

A case the planner refuses (ValueError: e.g. LoRA on a family it cannot count adapters for) is stored
as ``unsupported`` with the message and left out of the error figures; a simulator failure as ``error``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

from sweep_cases import case_id, draw_case  # noqa: E402
from sweep_report import summarise, write_summary  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the configs are made here: never ask the Hub for them
PROFILE_CACHE = Path("/tmp/dp-advisor-sweep-cache")  # traced profiles, shared by re-estimates


def training_options(job: dict) -> dict:
    """``advisor.plan`` keyword arguments for a job (``TrainingConfig`` fields and mesh pins)."""
    from advisor.model.lora import LoraConfig

    lora = job["lora"]
    if lora is not None:
        targets = lora["targets"]
        lora = LoraConfig(rank=lora["rank"], targets=tuple(targets) if isinstance(targets, list) else targets,
                          dora=lora["dora"], dropout=lora["dropout"])
    options = dict(strategy=job["strategy"], micro_batch_size=job["micro_batch"], seq_len=job["seq_len"],
                   activation_checkpointing=job["checkpointing"], precision=job["precision"], loss=job["loss"],
                   optimizer=job["optimizer"], lora=lora, attention=job.get("attention", "sdpa"))
    if job["tp"] > 1:
        options.update(tp=job["tp"], hybrid=job["replicate"])
    return options


def make_plan(case: dict):
    from advisor.planning.api import plan

    job = case["job"]
    return plan(dict(case["config"]), gpus=f"{job['world']}xH100", cache_dir=PROFILE_CACHE,
                **training_options(job))


def estimate(case: dict):
    """The plan's ``MemoryBreakdown`` for the case's candidate (the mesh one for a mesh job)."""
    job = case["job"]
    result = make_plan(case)
    if job["tp"] == 1:
        return result, result.candidate(job["strategy"])
    for candidate in result.candidates:
        mesh = candidate.mesh
        if mesh is not None and mesh.tp == job["tp"] and mesh.dp_replicate == job["replicate"] and mesh.cp == 1:
            return result, candidate
    raise ValueError(f"no candidate on the mesh tp {job['tp']} x replicate {job['replicate']}")


def simulate_case(case: dict, result, candidate) -> dict:
    """The simulator's peak for the case (``advisor simulate``'s path, or the mesh step)."""
    job = case["job"]
    if job["tp"] > 1:
        from advisor.simulate.mesh_step import simulate_mesh

        step = simulate_mesh(dict(case["config"]), dims=candidate.mesh, training=result.training,
                             micro_batch_size=job["micro_batch"], checkpointing=bool(candidate.activation_checkpointing))
        parts = {k: getattr(step, k) for k in ("params", "grads", "optimizer", "activations", "temporary")}
        return dict(sim_bytes=step.peak_bytes, sim_phase=None, sim_parts=parts, sim_s=step.wall_s)
    from advisor.simulate.step import simulate

    # What advisor.simulate.verify.verify runs for this candidate, given the config itself (verify
    # resolves the plan's model by name, and these configs have no name to resolve).
    mode = "selective" if candidate.selective_checkpointing else result.training.activation_checkpointing
    sim = simulate(dict(case["config"]), world_size=job["world"], strategy=job["strategy"],
                   training=result.training.model_copy(update={"activation_checkpointing": mode}),
                   micro_batch_size=candidate.micro_batch_size, checkpointing=bool(candidate.activation_checkpointing))
    parts = {k: getattr(sim, k) for k in ("params", "grads", "optimizer", "activations", "temporary")}
    return dict(sim_bytes=sim.peak_allocated, sim_phase=sim.peak_phase, sim_parts=parts, sim_s=sim.wall_s)


def estimate_fields(candidate) -> dict:
    mem = candidate.memory_bytes
    if mem is None:
        raise ValueError(f"no estimate: {candidate.unavailable_reason or 'does not fit'}")
    parts = {k: getattr(mem, k) for k in ("params", "grads", "optimizer", "activations", "temporary")}
    return dict(est_bytes=mem.peak_allocated, est_moment=mem.peak_moment, est_parts=parts,
                checkpointing_used=bool(candidate.activation_checkpointing))


def run_case(case: dict) -> dict:
    """One stored row: the case, its status, both peaks and the error in % of the simulated peak."""
    row = dict(id=case_id(case), **case)
    try:
        result, candidate = estimate(case)
        row.update(estimate_fields(candidate))
    except ValueError as exc:
        return dict(row, status="unsupported", message=str(exc).splitlines()[0][:300])
    except Exception as exc:  # noqa: BLE001  (a traceback in the planner is a finding too)
        return dict(row, status="error", message=f"planner: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    try:
        row.update(simulate_case(case, result, candidate))
    except Exception as exc:  # noqa: BLE001  (a simulator failure is a finding: keep it, go on)
        return dict(row, status="error", message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    row["err_pct"] = round(100 * (row["est_bytes"] - row["sim_bytes"]) / row["sim_bytes"], 3)
    return dict(row, status="ok")


def reestimate(row: dict) -> dict:
    """``row`` with its analytic side recomputed by the estimator as it is now."""
    case = {k: row[k] for k in ("family", "kind", "config", "job")}
    if row["status"] == "error" and not row["message"].startswith("planner:"):
        try:  # the simulator failed: nothing to re-score, unless the planner now refuses the job too
            estimate(case)
        except ValueError as exc:
            return dict(row, status="unsupported", message=str(exc).splitlines()[0][:300])
        return row
    try:
        _, candidate = estimate(case)
        fields = estimate_fields(candidate)
    except ValueError as exc:
        return dict(row, status="unsupported", message=str(exc).splitlines()[0][:300])
    except Exception as exc:  # noqa: BLE001
        return dict(row, status="error", message=f"planner: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    if row["status"] != "ok":  # newly supported: simulate it now
        return run_case(case)
    return dict(row, **fields, err_pct=round(100 * (fields["est_bytes"] - row["sim_bytes"]) / row["sim_bytes"], 3))


def rerun(rows: list[dict], ids: set[str]) -> list[dict]:
    """``rows`` with the cases in ``ids`` planned and simulated again (after a fix of the simulator,
    which ``--reestimate`` does not rerun), each keeping its seed and index."""
    import click

    out = []
    for row in rows:
        if row["id"] in ids:
            case = {k: row[k] for k in ("family", "kind", "config", "job")}
            new = dict(run_case(case), seed=row.get("seed"), index=row.get("index"))
            click.echo(f"{row['id']}: {row.get('err_pct')} -> {new.get('err_pct')} ({new['status']})", err=True)
            row = new
        out.append(row)
    return out


def load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_sweep(seed: int, cases: int, *, out: Path, budget_s: float | None = None, quiet: bool = False) -> list[dict]:
    """Draw and run cases ``0..cases-1`` of ``seed``, appending new rows to ``out``; returns this seed's rows."""
    import click

    warnings.filterwarnings("ignore")
    done = {row["id"]: row for row in load_rows(out)}
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.perf_counter()
    with click.progressbar(range(cases), label=f"sweep seed {seed}", file=sys.stderr,
                           show_pos=True, item_show_func=lambda i: None if i is None else f"case {i}") as bar:
        for index in bar:
            case = draw_case(seed, index)
            cid = case_id(case)
            if cid in done:
                rows.append(done[cid])
                continue
            if budget_s is not None and time.perf_counter() - start > budget_s:
                break
            row = dict(run_case(case), seed=seed, index=index)
            rows.append(row)
            done[cid] = row
            with out.open("a") as fh:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
            if not quiet and row["status"] != "ok":
                click.echo(f"\ncase {index} ({row['family']}): {row['status']}: {row['message']}", err=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="which random cases (default 0)")
    parser.add_argument("--cases", type=int, default=50, help="how many cases of the seed (default 50)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop drawing new cases after this long")
    parser.add_argument("--out", type=Path, default=RESULTS / "sweep.jsonl", help="the JSONL appended to")
    parser.add_argument("--summary", type=Path, default=RESULTS / "sweep_summary.md",
                        help="where the summary of every row in --out is written ('-': print only)")
    parser.add_argument("--reestimate", action="store_true",
                        help="recompute the estimate of every stored row (after a fix), rewrite --out, summarise")
    parser.add_argument("--rerun", nargs="+", metavar="ID", default=None,
                        help="plan and simulate these stored cases again (after a simulator fix), rewrite --out, summarise")
    args = parser.parse_args()
    if args.rerun:
        warnings.filterwarnings("ignore")
        rows = rerun(load_rows(args.out), set(args.rerun))
        args.out.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    elif args.reestimate:
        warnings.filterwarnings("ignore")
        rows = [reestimate(row) for row in load_rows(args.out)]
        args.out.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    else:
        run_sweep(args.seed, args.cases, out=args.out, budget_s=args.budget_s)
        rows = load_rows(args.out)
    text = summarise(rows)
    print(text)
    if str(args.summary) != "-":
        write_summary(rows, args.summary)


if __name__ == "__main__":
    main()
