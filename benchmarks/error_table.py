"""Build ``profiles/memory_error.json`` (the range of every memory estimate) from every measured comparison.

    PYTHONPATH=$PWD python benchmarks/error_table.py

One command, no GPU: the estimates are recomputed by the code as it is, against the stored measurements.

Comparisons (truth / estimate - 1, one per measured figure):

- ``h100-truth``: our H100 runs (``benchmarks/results/gpu_truth.csv`` and ``gpu_truth_variants.csv``): measured
  ``max_memory_allocated`` against the estimated peak allocated, measured ``max_memory_reserved`` against the
  estimated ``reserved`` (torch recipe);
- ``h100-stacks``: Trainer / PEFT / ``wrap()`` on the H100 (``benchmarks/results/gpu_stacks.jsonl``, planned as
  ``benchmarks/gpu_stacks_report.py`` plans them; the fake-group ``impl`` and ``eager`` rows give allocated only);
  ``h200-stacks``: that file's rows of 2026-11-29 (``gpu_stacks_report.source_of``: BERT-large under the Trainer,
  the README's two jobs, on an H200; their nvidia-smi figures are reserved plus what stays outside the allocator,
  scored in gpu_stacks.md, not here);
- each published source of ``profiles/published_memory.json`` (its id's first word), the cases whose settings we
  can express, planned as ``benchmarks/published_memory.py`` plans them: allocated and active figures against the
  peak allocated; reserved, unspecified and nvidia-smi figures against ``reserved`` (nvidia-smi less the CUDA
  context and NCCL buffers the plan puts outside the allocator, so that the plan's range of its total, which adds
  that part unscaled, holds the figure exactly when the ratio lies in the row's bounds).

Keys: what was measured (allocated, or reserved: the figure the plan's range is of), the stack (recipe) and the
tuning (full, LoRA, QLoRA); each comparison also records the model family (not a key today). A row is kept at
each level of ``advisor.calibration.KEY_LEVELS`` (most specific first) that has at least ``MIN_CASES``
comparisons from at least ``MIN_SOURCES`` sources; a plan takes the most specific row that matches it. A row of one
source cannot push its ends (below), so it says nothing of how far the next source lies: with such rows allowed,
after our H100 Trainer runs of 2026-11-27 made the Trainer LoRA row one of our runs alone once fms was held out,
27 of 31 published reserved figures were held out of their source (range_coverage), 98 of 104 reserved comparisons,
214 of 229 in all; with two sources required 28 of 31, 99 of 104 and 219 of 229 (median width 50.3 -> 54.4 points). The spread (``spread``): the lowest and highest
ratio of the group (zero always inside), each end pushed out by the farthest any one source of the group lay
beyond the others (its own extreme against the lowest / highest ratio of every other source of the group, zero
included; no push from a group of one source). The push is what a source the table has not seen may add: every
source so far lay that far outside the rest at most. Keys without data take the default row: the measured kind
over every source.

Why the push, scored held out by source (``benchmarks/range_coverage.py``, 2026-11-26): plain min-max held 15 of
the 17 published reserved figures (88%), 62 of 72 reserved comparisons and 145 of 165 comparisons in all; with the
push 16 of 17 (94%), 68 of 72 and 154 of 165, the median width of the published figures' ranges 41.7 -> 58.9
points (half the push held 16 of 17, 66 of 72, 149 of 165). No min-max rule could hold more than 15 of 17: the two
misses (LLaMA-Factory QLoRA at 16k and 32k tokens, -12.0% and -16.5%) lie below every other source's lowest
reserved ratio. Why min-max and not the 5th-95th percentile, and why no family key: the percentile trimmed
exactly the extremes another source reaches (published reserved figures held 12-13 of 17 with the 5th-95th
percentile from 10 or 20 comparisons, 14 of 17 with min-max), and keying by family as well held 131 of 156
comparisons against 133 without it (2026-11-26).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from advisor.calibration import KEY_LEVELS  # noqa: E402
from profiles import PROFILES_DIR  # noqa: E402

RESULTS = HERE / "results"
MIN_CASES = 8  # fewer comparisons than this make no row of their own (the key falls back)
MIN_SOURCES = 2  # nor do comparisons from one source alone: they cannot say how far another source lies
# Published kinds: compared with the peak allocated, or with reserved (the range's quantity).
ALLOCATED_KINDS = ("allocated", "active")
RESERVED_KINDS = ("reserved", "unspecified", "nvidia-smi")


class Comparison(NamedTuple):
    """One measured figure against its estimate: ``ratio`` = truth / estimate - 1."""

    source: str
    case: str
    measured: str  # allocated | reserved
    recipe: str
    tuning: str    # full | lora | qlora
    family: str
    ratio: float

    def key(self, level: tuple[str, ...]) -> tuple:
        return (self.measured,) + tuple(getattr(self, name) for name in level)


def _outward(low: float, high: float) -> tuple[float, float]:
    """Rounded outward to 4 decimals (so the group's own extremes stay inside)."""
    return math.floor(round(low * 1e4, 6)) / 1e4, math.ceil(round(high * 1e4, 6)) / 1e4


def spread(by_source: dict[str, list[float]]) -> tuple[float, float]:
    """(low, high) of a group's ratios, given per source: the lowest and the highest, zero always inside (an
    estimate's range holds the estimate), each pushed out by the farthest one source's own extreme lay beyond
    the other sources' lowest / highest (zero included), rounded outward to 4 decimals."""
    ratios = [r for values in by_source.values() for r in values]
    low, high = min(0.0, *ratios), max(0.0, *ratios)
    below = above = 0.0
    if len(by_source) > 1:
        for source, mine in by_source.items():
            others = [r for name, values in by_source.items() if name != source for r in values]
            below = max(below, min(0.0, *others) - min(mine))
            above = max(above, max(mine) - max(0.0, *others))
    return _outward(low - below, high + above)


def truth_estimates() -> list[tuple[str, dict, object]]:
    """(label, csv row, estimated MemoryBreakdown) for every run of ``gpu_truth.csv`` then
    ``gpu_truth_variants.csv``, planned with the torch recipe at the run's settings."""
    import accuracy
    import accuracy_variants
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.model.lora import with_lora
    from advisor.strategies import get_strategy

    out = []
    for name in ("gpu_truth.csv", "gpu_truth_variants.csv"):
        with open(RESULTS / name) as handle:
            for r in csv.DictReader(handle):
                rank = int(r["lora_rank"]) if r.get("lora_rank") not in (None, "", "-") else None
                ckpt = "selective" if r["checkpointing"] == "selective" else r["checkpointing"] == "True"
                config = accuracy_variants.training(int(r["seq_len"]), None if rank is None else (rank, None, 0.0),
                                                    r.get("loss") or "hf", ckpt)
                spec = accuracy.spec_for(accuracy.MODELS[r["model"]])
                spec = with_lora(spec, config.lora) if config.lora else spec
                mem = estimate_memory(spec, parse_gpus(f"{r['world']}xH100"), config,
                                      get_strategy(r["strategy"]).on("torch"), micro_batch_size=int(r["micro_batch"]),
                                      checkpointing=bool(ckpt))
                label = f"{r['model']} {r['strategy']} x{r['world']} mb{r['micro_batch']} s{r['seq_len']}" + (
                    f" lora{rank}" if rank else "") + (f" {r['loss']}" if r.get("loss", "hf") != "hf" else "")
                out.append((label, r, mem))
    return out


def _truth_rows() -> list[Comparison]:
    import accuracy

    out = []
    for label, r, mem in truth_estimates():
        rank = r.get("lora_rank") not in (None, "", "-")
        common = dict(source="h100-truth", case=label, recipe="torch", tuning="lora" if rank else "full",
                      family=accuracy.spec_for(accuracy.MODELS[r["model"]]).model_type or "unknown")
        out.append(Comparison(measured="allocated", ratio=int(r["gpu_max_allocated_bytes"]) / mem.peak_allocated - 1,
                              **common))
        out.append(Comparison(measured="reserved", ratio=int(r["gpu_max_reserved_bytes"]) / mem.reserved - 1,
                              **common))
    return out


def _stack_rows() -> list[Comparison]:
    import accuracy
    import gpu_stacks_report

    out = []
    for row in gpu_stacks_report.load():
        mem = gpu_stacks_report.estimate(row)
        recipe = gpu_stacks_report.job(row).get("recipe", "torch")
        common = dict(source=gpu_stacks_report.source_of(row), case=f"{gpu_stacks_report.label(row)} {row['model']} "
                      f"mb{row['micro_batch']} s{row['seq_len']}", recipe=recipe,
                      tuning="lora" if row.get("lora_rank") else "full",
                      family=accuracy.spec_for(accuracy.MODELS.get(row["model"], row["model"])).model_type or "unknown")
        out.append(Comparison(measured="allocated", ratio=row["allocated"] / mem.peak_allocated - 1, **common))
        # impl and eager rows run a fake group's rank 0 after materialising the whole model: allocated only
        if row["kind"] in gpu_stacks_report.RESERVED_SCORED:
            out.append(Comparison(measured="reserved", ratio=row["reserved"] / mem.reserved - 1, **common))
    return out


def published_comparison(case: dict, est, model_type: str) -> Comparison | None:
    """The comparison of one expressible published case (None for OOM / trained rows and settings we cannot
    express): ``est`` is ``published_memory.estimate(case)``."""
    import published_memory

    if case["not_expressible"] or case["kind"] not in ALLOCATED_KINDS + RESERVED_KINDS:
        return None
    truth = published_memory.published_bytes(case)
    if case["kind"] in ALLOCATED_KINDS:
        measured, ratio = "allocated", truth / est.allocated - 1
    else:  # nvidia-smi: less what the plan holds outside the allocator (added to the range unscaled)
        outside = est.outside if case["kind"] == "nvidia-smi" else 0
        measured, ratio = "reserved", (truth - outside) / est.reserved - 1
    tuning = "qlora" if case.get("quantize") else "lora" if case.get("lora") else "full"
    return Comparison(source=published_memory.source_of(case), case=case["id"], measured=measured,
                      recipe=case.get("stack") or "torch", tuning=tuning, family=model_type, ratio=ratio)


def _published_rows() -> list[Comparison]:
    import published_memory

    out = []
    for case in json.loads((PROFILES_DIR / "published_memory.json").read_text())["cases"]:
        if case["not_expressible"] or case["kind"] not in ALLOCATED_KINDS + RESERVED_KINDS:
            continue
        model_type = published_memory.plan_of(case).model.model_type or "unknown"
        found = published_comparison(case, published_memory.estimate(case), model_type)
        if found:
            out.append(found)
    return out


def comparisons() -> list[Comparison]:
    """Every measured comparison we have, estimates recomputed by the current code."""
    warnings.filterwarnings("ignore")
    return _truth_rows() + _stack_rows() + _published_rows()


def build_rows(found: list[Comparison]) -> list[dict]:
    """The table's rows: one per key with at least ``MIN_CASES`` comparisons at each level, the default (no key
    but the measured kind) always."""
    rows = []
    for level in KEY_LEVELS:
        groups: dict[tuple, list[Comparison]] = {}
        for c in found:
            groups.setdefault(c.key(level), []).append(c)
        for key, members in sorted(groups.items()):
            by_source: dict[str, list[float]] = {}
            for c in members:
                by_source.setdefault(c.source, []).append(c.ratio)
            if (len(members) < MIN_CASES or len(by_source) < MIN_SOURCES) and level:
                continue
            low, high = spread(by_source)
            sources = sorted({c.source for c in members})
            rows.append(dict(zip(("measured",) + level, key), low=low, high=high, cases=len(members),
                             source=", ".join(sources)))
    return rows


def build(found: list[Comparison] | None = None) -> dict:
    found = comparisons() if found is None else found
    return {
        "description": "The range of a memory estimate: truth / estimate - 1 of every measured comparison "
                       "(our H100 runs, the H100 stacks, the expressible published cases), by what was measured, "
                       "stack (recipe) and tuning; a plan takes the most specific row that matches it "
                       f"(levels: advisor.calibration.KEY_LEVELS; a row needs {MIN_CASES} comparisons). Spread: "
                       "the lowest and highest ratio of the group, zero inside, each end pushed out by the farthest "
                       "one source of the group lay beyond its other sources (zero included). "
                       "Built by benchmarks/error_table.py; read by advisor.calibration.",
        "rows": build_rows(found),
        "comparisons": [c._asdict() | {"ratio": round(c.ratio, 4)} for c in found],
    }


def main() -> None:
    table = build()
    (PROFILES_DIR / "memory_error.json").write_text(json.dumps(table, indent=1) + "\n")
    for row in table["rows"]:
        print({k: v for k, v in row.items() if k != "source"})


if __name__ == "__main__":
    main()
