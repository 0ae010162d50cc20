"""What must fit: the whole allocator gap (the default) against the part read from runs under a cap on reserved memory.

    PYTHONPATH=$PWD python benchmarks/fit_gap.py      # writes benchmarks/results/fit_gap.md

A plan fits when its total (peak allocated + the allocator's gap + the CUDA context) is within the GPU's memory. The
gap is calibrated on what torch.cuda.max_memory_reserved() reports when memory is plentiful (fragmentation, 10.4% of
the peak, profiles/allocator_overhead.json); but the caching allocator frees its cached blocks and retries before it
fails an allocation, so a run needs less than it reserves. ``--fit-fragmentation F`` counts only F of the peak in what
must fit (the rest, allocator_cache, in reserved only). This script sets the default against F = the profile's
capped_fit_fragmentation on every check the project has of the fit verdict:

1. the runs under a cap (benchmarks/results/gpu_stacks.jsonl, rows with cap_gib): with the measured allocated peak,
   the verdict (1 + f) x allocated + allocator_constant_gib <= cap against whether the run trained;
2. the published runs that trained or ran out of memory (profiles/published_memory.json, kinds trained / oom:
   ``published_memory.estimate``'s total against the GPU);
3. the published jobs panel (profiles/published_jobs.json: ``published_jobs.judge``);
4. the longest sequence a published setup fits (profiles/published_longest.json: ``longest_context.longest``).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import longest_context
import published_jobs
import published_memory
from profiles import PROFILES_DIR

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "benchmarks" / "results" / "fit_gap.md"
STACKS = ROOT / "benchmarks" / "results" / "gpu_stacks.jsonl"
GIB = 2**30


def overhead() -> dict:
    return json.loads((PROFILES_DIR / "allocator_overhead.json").read_text())


def capped_runs() -> list[dict]:
    """Each capped run with the allocated peak of its job (measured where it trained; an OOM row has none, so the
    peak of the same job's runs that trained)."""
    rows = [json.loads(line) for line in STACKS.read_text().splitlines() if line.strip()]
    capped = [r for r in rows if r.get("cap_gib") is not None]
    peaks: dict[str, int] = defaultdict(int)
    for r in capped:
        if r.get("allocated"):
            peaks[r.get("name") or r["kind"]] = max(peaks[r.get("name") or r["kind"]], r["allocated"])
    return [dict(r, job_allocated=peaks[r.get("name") or r["kind"]]) for r in capped]


def capped_verdicts(fraction: float, constant_gib: float) -> list[tuple[dict, bool]]:
    """(run, verdict right) for every capped run at ``fraction`` of the peak in what must fit."""
    out = []
    for r in capped_runs():
        need = (1 + fraction) * r["job_allocated"] / GIB + constant_gib
        out.append((r, (need <= r["cap_gib"]) == (r["oom"] is None)))
    return out


def interval(constant_gib: float) -> tuple[float, float]:
    """The fractions that judge every capped run right: above what each OOM's cap allows, at most what each trained
    run's cap allows."""
    low, high = 0.0, 1.0
    for r in capped_runs():
        bound = (r["cap_gib"] - constant_gib) * GIB / r["job_allocated"] - 1
        if r["oom"] is None:
            high = min(high, bound)
        else:
            low = max(low, bound)
    return low, high


def boundary_cases(fraction: float | None) -> list[tuple[dict, float, bool]]:
    """(case, total / GPU - 1, verdict right) for the published trained / OOM rows."""
    extra = {} if fraction is None else {"fit_fragmentation": fraction}
    out = []
    for case in json.loads((PROFILES_DIR / "published_memory.json").read_text())["cases"]:
        if case["kind"] not in published_memory.BOUNDARY_KINDS:
            continue
        _, total, _, _ = published_memory.estimate(case, **extra).compared(case["kind"])
        truth = published_memory.published_bytes(case)
        fits = total <= truth
        out.append((case, total / truth - 1, fits == (case["kind"] == "trained")))
    return out


def main() -> int:
    gap = overhead()
    fraction, constant = gap["capped_fit_fragmentation"], gap["allocator_constant_gib"]
    default = gap["fragmentation"]
    lines = ["# What must fit: the whole allocator gap or the part capped runs need", "",
             f"Written by `PYTHONPATH=$PWD python benchmarks/fit_gap.py` (method: the script's docstring). default: "
             f"every plan's total holds the calibrated gap, {default:.1%} of the peak + {constant:g} GiB; capped: "
             f"`--fit-fragmentation {fraction:g}` (profiles/allocator_overhead.json capped_fit_fragmentation), the "
             "rest of the gap in reserved only.", ""]

    low, high = interval(constant)
    lines += ["## 1. Runs under a cap on reserved memory (H100, H200)", "",
              f"Fractions of the peak that judge every capped run right: ({low:.4f}, {high:.4f}].", "",
              "| run | cap GiB | allocated GiB | outcome | default judges | capped judges |", "|---|---:|---:|---|---|---|"]
    for (r, ok_default), (_, ok_capped) in zip(capped_verdicts(default, constant), capped_verdicts(fraction, constant)):
        lines.append(f"| {r.get('name') or r['kind']} | {r['cap_gib']:g} | {r['job_allocated'] / GIB:.2f} | "
                     f"{'trained' if r['oom'] is None else 'OOM'} | {'right' if ok_default else 'WRONG'} | "
                     f"{'right' if ok_capped else 'WRONG'} |")
    for label, f in (("default", default), ("capped", fraction)):
        got = capped_verdicts(f, constant)
        lines.append(f"\n{label}: {sum(ok for _, ok in got)} of {len(got)} right")
    print(f"capped runs done: interval ({low:.4f}, {high:.4f}]", file=sys.stderr)

    lines += ["", "## 2. Published runs that trained or ran out of memory", "",
              "| case | kind | default: total / GPU - 1 | capped | default judges | capped judges |",
              "|---|---|---:|---:|---|---|"]
    before, after = boundary_cases(None), boundary_cases(fraction)
    for (case, e0, ok0), (_, e1, ok1) in zip(before, after):
        lines.append(f"| {case['id']} | {case['kind']} | {e0:+.1%} | {e1:+.1%} | {'right' if ok0 else 'WRONG'} | "
                     f"{'right' if ok1 else 'WRONG'} |")
    for label, got in (("default", before), ("capped", after)):
        trained = [ok for c, _, ok in got if c["kind"] == "trained"]
        oom = [ok for c, _, ok in got if c["kind"] == "oom"]
        lines.append(f"\n{label}: trained runs judged to fit {sum(trained)} of {len(trained)}; OOM runs judged not to "
                     f"fit {sum(oom)} of {len(oom)}")
    print("published boundaries done", file=sys.stderr)

    lines += ["", "## 3. Published jobs panel", ""]
    panel = published_jobs.load_panel()
    verdicts = {label: [published_jobs.judge(job, **extra) for job in panel.jobs]
                for label, extra in (("default", {}), ("capped", {"fit_fragmentation": fraction}))}
    for label, got in verdicts.items():
        lines.append(f"- {label}: {published_jobs.summary(got)}")
    lines += ["", "Jobs whose verdicts move:", "", "| job | fits (default -> capped) | recommended (default -> capped) | "
              "ratio (default -> capped) |", "|---|---|---|---|"]
    for a, b in zip(verdicts["default"], verdicts["capped"]):
        if (a.fits, a.recommended, a.speed_ratio) != (b.fits, b.recommended, b.speed_ratio):
            ratio = lambda v: "-" if v.speed_ratio is None else f"{v.speed_ratio:.2f}"
            lines.append(f"| {a.job.id} | {a.fits} -> {b.fits} | {a.recommended} -> {b.recommended} | "
                         f"{ratio(a)} -> {ratio(b)} |")
    print("panel done", file=sys.stderr)

    lines += ["", "## 4. Longest sequence a published setup fits", "",
              "error: ours / published - 1 (positive: a longer sequence would start than fitted, the side that runs "
              "out of memory).", "", "| case | published | default | capped |", "|---|---:|---:|---:|"]
    errors: dict[str, list[float]] = defaultdict(list)
    for case in longest_context.load_cases():
        if case["kind"] == "longest":
            cells = []
            for label, extra in (("default", {}), ("capped", {"fit_fragmentation": fraction})):
                ours = longest_context.longest(case, **extra)
                errors[label].append(abs(ours / case["figure"] - 1))
                cells.append(f"{ours:,} ({ours / case['figure'] - 1:+.1%})")
            lines.append(f"| {case['id']} | {case['figure']:,} | {cells[0]} | {cells[1]} |")
        else:
            cells = ["fits" if longest_context.fits(case, case["seq_len"], **extra) else "does not fit"
                     for extra in ({}, {"fit_fragmentation": fraction})]
            lines.append(f"| {case['id']} | OOM at any length | {cells[0]} at {case['seq_len']:,} | {cells[1]} |")
    for label, errs in errors.items():
        lines.append(f"\n{label}: median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}")
    REPORT.write_text("\n".join(lines) + "\n")
    print(f"wrote {REPORT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
