"""Judge our advice against published training jobs that really ran (``profiles/published_jobs.json``).

    PYTHONPATH=$PWD python benchmarks/published_jobs.py     # table; writes benchmarks/results/published_jobs.md and .csv

For each job, three questions (issue 19, "Must show"):

(a) fit: the published setup, pinned (strategy, mesh, micro-batch, sequence, checkpointing, precision,
    optimizer, loss kernel, LoRA / quantisation, engine), is planned at the default margin; it ran, so it
    must be judged to fit;
(b) offload: the same job unpinned (model, GPUs, sequence, precision, optimizer, LoRA / quantisation and
    the stated global batch fixed; strategy, micro-batch, checkpointing and loss left to the planner)
    must not recommend CPU offload where the published job kept everything on the GPUs;
(c) speed: where a speed was published (or derived from a published time), our estimated tokens/s per
    GPU of that recommendation must not be below it (the ratio is reported).

Each job is planned with the recipe of the stack that ran it (torch / trainer / lightning / torchtitan /
deepspeed: ``profiles/recipes.json``) and its optimizer implementation where the source states one, pinned
and unpinned alike: torchtitan's TP meshes run sequence parallelism and a vocabulary-parallel loss, a
Trainer job steps fused AdamW. Models the resolver cannot read are skipped with the reason printed.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

import advisor
from advisor.hardware.cluster import Hardware, parse_gpus
from advisor.model.lora import LoraConfig
from advisor.model.sources import resolve
from advisor.frozen import validated_copy
from advisor.recipes import RecipeName as Recipe
from advisor.recipes import get_recipe
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig
from advisor.units import GIB
from profiles import PROFILES_DIR

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PANEL = PROFILES_DIR / "published_jobs.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    title: str = Field(description="What the source is (file, table, commit).")
    url: str = Field(pattern=r"^https://", description="Where it is.")
    where: str = Field(description="The row, table or line the figures come from.")


class Lora(_Frozen):
    rank: int = Field(ge=1)
    targets: list[str] | str = Field(description="Module names, or 'all-linear'.")
    dropout: float = Field(ge=0, lt=1)
    modules_to_save: list[str] | None = Field(default=None, description="PEFT's modules_to_save: trainable full "
                                              "copies (the head, the embedding).")


class Job(_Frozen):
    """One published job, as its source states it (``assumed``: what it does not state)."""

    id: str
    source: Source
    recipe: Recipe = Field(description="The training stack that ran it.")
    model: str = Field(description="A bundled model id (python -m advisor.cli.main models).")
    gpus: str = Field(description="How we plan it: COUNTxNAME or NODESxPERxNAME from the catalogue.")
    gpu_kind: str = Field(description="The GPU as the source names it.")
    gpu_memory_gib: float | None = Field(default=None, gt=0, description="Device memory replacing the catalogue's "
                                         "(a part the catalogue lacks).")
    gpu_note: str | None = None
    seq_len: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    global_batch_size: int | None = Field(default=None, ge=1)
    gradient_accumulation_steps: int | None = Field(default=None, ge=1)
    precision: Literal["bf16-mixed", "bf16", "fp16-mixed", "fp32"]
    optimizer: Literal["adamw", "adamw-8bit", "adamw-8bit-paged", "sgd", "adafactor"]
    bitsandbytes: str | None = Field(default=None, description="The bitsandbytes release an 8-bit optimizer ran "
                                     "(TrainingConfig.bitsandbytes); None: the newest.")
    optimizer_in_backward: bool = Field(default=False, description="The step runs per parameter inside backward "
                                        "(torchtune's optimizer_in_bwd).")
    optimizer_impl: Literal["fused", "foreach", "for-loop"] | None = None
    fsdp_version: Literal[1, 2] | None = Field(default=None, description="The FSDP that ran a sharded strategy: 1 "
                                               "(FullyShardedDataParallel, flat parameters: accelerate's and "
                                               "fsdp_qlora's before FSDP2) or 2; None: the recipe's default.")
    transformers_release: str | None = Field(default=None, description="The transformers release that ran it, where "
                                             "a release changes what is allocated (TrainingConfig."
                                             "transformers_release); None: the newest.")
    engine: Literal["torch", "deepspeed"]
    strategy: Literal["ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"]
    strategy_as_run: str
    tp: int = Field(ge=1)
    cp: int = Field(ge=1)
    activation_checkpointing: Literal["on", "off", "selective"]
    loss: Literal["hf", "chunked", "fused"]
    lora: Lora | None = None
    quantize: Literal["nf4", "fp4", "int8"] | None = None
    double_quant: bool | None = None
    compile: bool
    float8: bool
    float8_all_gather: bool = Field(default=False, description="torchao enable_fsdp_float8_all_gather (with float8).")
    loss_compiled: bool | None = Field(default=None, description="False: the release that ran left the loss eager "
                                       "although its recipe compiles it under compile (torchtitan before bbb1b616e); "
                                       "None: the recipe's.")
    chunked_logits: Literal["loss", "model"] | None = Field(default=None, description="The stack's own chunked loss "
                                                            "as it was at the source's date (Recipe.chunked_logits); "
                                                            "None: the recipe's.")
    offloaded: bool = Field(description="The job kept parameters or optimizer state in CPU memory.")
    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    speed_basis: str | None = None
    memory_gib: float | None = Field(default=None, gt=0, description="Published peak per GPU, when given.")
    not_expressible: list[str]
    approximated: list[str]
    assumed: list[str]


class Panel(_Frozen):
    description: str
    jobs: list[Job] = Field(min_length=1)


def load_panel(path: Path = PANEL) -> Panel:
    return Panel.model_validate(json.loads(path.read_text()))


def hardware_of(job: Job) -> Hardware:
    """The job's cluster; a part the catalogue lacks (Meta's 96 GB H100) keeps the nearest part's speeds
    with the memory the source states."""
    hw = parse_gpus(job.gpus)
    if job.gpu_memory_gib is None:
        return hw
    gpu = hw.gpu.model_copy(update={"nominal_memory_gb": job.gpu_memory_gib, "memory_bytes": int(job.gpu_memory_gib * GIB)})
    return hw.model_copy(update={"gpu": gpu})


def _fixed(job: Job) -> dict:
    """What the user fixes: the mathematics of the job and the code that runs it (its loss kernel, compile): the
    planner does not choose those, it names them as remedies. Unpinned plans keep only these."""
    recipe = job.recipe if job.loss_compiled is not False else \
        get_recipe(job.recipe).model_copy(update={"compile_loss": False})
    if job.chunked_logits is not None:
        base = get_recipe(recipe) if isinstance(recipe, str) else recipe
        recipe = validated_copy(base, {"chunked_logits": job.chunked_logits})
    options = dict(seq_len=job.seq_len, precision=job.precision, optimizer=job.optimizer, recipe=recipe,
                   engine=job.engine, compile=job.compile, loss=job.loss)
    if job.optimizer_impl is not None:
        options["optimizer_impl"] = job.optimizer_impl
    if job.transformers_release is not None:
        options["transformers_release"] = job.transformers_release
    if job.fsdp_version is not None:
        options["fsdp_version"] = job.fsdp_version
    if job.optimizer_in_backward:
        options["optimizer_in_backward"] = True
    if job.bitsandbytes is not None:  # the release its 8-bit optimizer ran (advisor.estimate.optimizer_8bit)
        options["bitsandbytes"] = job.bitsandbytes
    if job.lora is not None:
        targets = job.lora.targets if isinstance(job.lora.targets, str) else tuple(job.lora.targets)
        saved = tuple(job.lora.modules_to_save) if job.lora.modules_to_save else None
        options["lora"] = LoraConfig(rank=job.lora.rank, targets=targets, dropout=job.lora.dropout,
                                     modules_to_save=saved)
    if job.quantize is not None:
        options.update(quantize=job.quantize, double_quant=bool(job.double_quant))
    if job.float8:  # torchao float8 linears (advisor.estimate.float8_time)
        options.update(float8=True, float8_all_gather=job.float8_all_gather)
    if job.global_batch_size is not None:
        options["global_batch_size"] = job.global_batch_size
    return options


def plan_pinned(job: Job, **overhead: float):
    """The published setup, every knob it states pinned (recipe and optimizer_impl: see module docstring), its
    global batch too: gradient accumulation holds the gradients between micro-batches (advisor.estimate.accumulation)."""
    fixed = _fixed(job)
    options = dict(fixed, micro_batch_size=job.micro_batch_size, loss=job.loss,
                   activation_checkpointing=job.activation_checkpointing)
    mesh = dict(tp=job.tp if job.tp > 1 else None, cp=job.cp if job.cp > 1 else None)
    return advisor.plan(job.model, hardware_of(job), strategy=job.strategy, **mesh, **options, **overhead)


def plan_unpinned(job: Job, **overhead: float):
    return advisor.plan(job.model, hardware_of(job), **_fixed(job), **overhead)


def pinned_candidate(job: Job, plan):
    """The candidate of the published strategy (its mesh, when tp or cp > 1)."""
    if job.tp == job.cp == 1:
        return plan.candidate(job.strategy)
    return next(c for c in plan.candidates if c.strategy == job.strategy and c.mesh is not None
                and (c.mesh.tp, c.mesh.cp) == (job.tp, job.cp))


def offloads(strategy: str, engine: str) -> bool:
    impl = get_strategy(strategy).on(engine)
    return impl.offload_optimizer or impl.offload_params


class Verdict(NamedTuple):
    job: Job
    skipped: str | None = None
    fits: bool | None = None
    pinned_gib: float | None = None
    capacity_gib: float | None = None
    recommended: str | None = None
    recommended_offloads: bool | None = None
    tokens_per_s_per_gpu: float | None = None
    pinned_tokens_per_s_per_gpu: float | None = None

    @property
    def offload_ok(self) -> bool | None:
        if self.recommended_offloads is None:  # skipped, or nothing fits unpinned (a failure of its own)
            return None
        return self.job.offloaded or not self.recommended_offloads

    @property
    def speed_ratio(self) -> float | None:
        if self.tokens_per_s_per_gpu is None or self.job.tokens_per_s_per_gpu is None:
            return None
        return self.tokens_per_s_per_gpu / self.job.tokens_per_s_per_gpu


def judge(job: Job, **overhead: float) -> Verdict:
    """The job's verdicts (``overhead``: allocator settings in place of the defaults, e.g. fit_fragmentation)."""
    try:
        resolve(job.model)
    except (ValueError, LookupError, OSError) as err:  # a model the resolver cannot read: skipped, reason printed
        return Verdict(job, skipped=f"{type(err).__name__}: {' '.join(str(err).split())[:160]}")
    pinned, unpinned = plan_pinned(job, **overhead), plan_unpinned(job, **overhead)  # a planner error: a finding
    cand = pinned_candidate(job, pinned)
    mem = cand.memory_bytes
    rec, chosen = unpinned.recommendation, unpinned.chosen
    label = None if rec is None else rec.strategy + (f" tp{rec.mesh.tp} cp{rec.mesh.cp}" if rec.mesh is not None and
                                                     (rec.mesh.tp, rec.mesh.cp) != (1, 1) else "") + \
        f" mb{rec.micro_batch_size}" + (" sac" if rec.selective_checkpointing else " ac" if rec.activation_checkpointing else "")
    speed = chosen.step_time.tokens_per_s_per_gpu if chosen is not None and chosen.step_time is not None else None
    pinned_speed = cand.step_time.tokens_per_s_per_gpu if cand.step_time is not None else None
    return Verdict(job, fits=bool(cand.fits), pinned_gib=None if mem is None else mem.total / GIB,
                   pinned_tokens_per_s_per_gpu=pinned_speed,
                   capacity_gib=cand.capacity_bytes / GIB, recommended=label or "nothing fits",
                   recommended_offloads=None if rec is None else offloads(rec.strategy, rec.engine),
                   tokens_per_s_per_gpu=speed)


def _mark(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def rows(verdicts: list[Verdict]) -> list[dict]:
    out = []
    for v in verdicts:
        j = v.job
        mesh = "".join(f" {k}{d}" for k, d in (("tp", j.tp), ("cp", j.cp)) if d > 1)
        out.append({
            "job": j.id, "recipe": j.recipe, "model": j.model, "gpus": j.gpus,
            "published": f"{j.strategy}{mesh} mb{j.micro_batch_size} s{j.seq_len}" + (" offload" if j.offloaded else ""),
            "fits": "skipped" if v.skipped else _mark(v.fits),
            "pinned_gib": "" if v.pinned_gib is None else f"{v.pinned_gib:.1f}/{v.capacity_gib:.1f}",
            "recommended": v.skipped or v.recommended,
            "offload_ok": _mark(v.offload_ok),
            "pinned_tok_s_gpu": "" if v.pinned_tokens_per_s_per_gpu is None else f"{v.pinned_tokens_per_s_per_gpu:,.0f}",
            "ours_tok_s_gpu": "" if v.tokens_per_s_per_gpu is None else f"{v.tokens_per_s_per_gpu:,.0f}",
            "published_tok_s_gpu": "" if j.tokens_per_s_per_gpu is None else f"{j.tokens_per_s_per_gpu:,.0f}",
            "ratio": "" if v.speed_ratio is None else f"{v.speed_ratio:.2f}",
            "not_modelled": "; ".join(j.not_expressible),
        })
    return out


def summary(verdicts: list[Verdict]) -> str:
    done = [v for v in verdicts if not v.skipped]
    ratios = [v.speed_ratio for v in done if v.speed_ratio is not None]
    slower = [v.job.id for v in done if v.speed_ratio is not None and v.speed_ratio < 1]
    disagree = [v.job.id for v in done if v.offload_ok is False]
    nothing = [v.job.id for v in done if v.offload_ok is None]  # nothing fits unpinned: no recommendation to judge
    text = (f"{len(verdicts)} jobs ({len(verdicts) - len(done)} skipped); judged to fit: "
            f"{sum(bool(v.fits) for v in done)}/{len(done)}; offload agreement: "
            f"{len(done) - len(disagree) - len(nothing)}/{len(done)}"
            + (f" (nothing fits unpinned: {len(nothing)})" if nothing else "") +
            f"; speed not slower: {len(ratios) - len(slower)}/{len(ratios)}")
    if ratios:
        text += f" (ratio ours/published min {min(ratios):.2f}, median {sorted(ratios)[len(ratios) // 2]:.2f}, max {max(ratios):.2f})"
    return text


def _markdown(table: list[dict], verdicts: list[Verdict], line: str) -> str:
    head = list(table[0])
    lines = ["# Published jobs panel", "",
             "Generated by `PYTHONPATH=$PWD python benchmarks/published_jobs.py` from `profiles/published_jobs.json` "
             "(every job cited there). fits: the published setup, pinned, at the default margin (GiB: our total / "
             "the GPU's memory). recommended: the unpinned plan (strategy, micro-batch, checkpointing: sac selective, "
             "ac full). pinned_tok_s_gpu: our tokens/s per GPU of the published setup itself (where it fits). offload_ok: the recommendation does not offload where the job did not (or the job offloaded). "
             "ratio: our estimated tokens/s per GPU of the recommendation over the published one. Every job is planned "
             "with its recipe row (profiles/recipes.json) and stated optimizer implementation.", "",
             f"**{line}**", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in table]
    failures = [v for v in verdicts if not v.skipped and (not v.fits or v.offload_ok is not True or
                                                          (v.speed_ratio is not None and v.speed_ratio < 1))]
    if failures:
        lines += ["", "## Failures", ""]
        for v in failures:
            what = [w for w, bad in (("not judged to fit", not v.fits), ("offloads where the job did not", v.offload_ok is False),
                                     ("nothing fits unpinned", v.recommended_offloads is None),
                                     (f"estimated slower (ratio {v.speed_ratio:.2f})" if v.speed_ratio else "",
                                      v.speed_ratio is not None and v.speed_ratio < 1)) if bad]
            lines.append(f"- `{v.job.id}`: {', '.join(what)}; not modelled: {', '.join(v.job.not_expressible) or 'nothing listed'}; "
                         f"approximated: {', '.join(v.job.approximated) or 'nothing'}")
    return "\n".join(lines) + "\n"


def main() -> int:
    verdicts = [judge(job) for job in load_panel().jobs]
    table = rows(verdicts)
    widths = {k: max(len(k), *(len(str(r[k])) for r in table)) for k in table[0] if k not in ("model", "not_modelled")}
    print("  ".join(k.ljust(w) for k, w in widths.items()))
    for r in table:
        print("  ".join(str(r[k]).ljust(w) for k, w in widths.items()))
    line = summary(verdicts)
    print(line)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "published_jobs.md").write_text(_markdown(table, verdicts, line))
    with open(RESULTS / "published_jobs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
