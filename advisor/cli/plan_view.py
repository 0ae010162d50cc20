"""``advisor plan`` as a person reads it: the answer first, then one table sized to the terminal.

- ``answer_lines``: the recommendation with its figures (strategy, mesh, micro-batch, peak GiB of the
  GPU, step time, tokens/s) and one line of why, picked from the planner's reasons.
- ``plan_table``: one row per candidate; at a narrow terminal the least needed columns are dropped and
  mesh names abbreviated (``dp2 cp2 tp2``) until the table fits, so no cell is cut to ``3…``.
- behind ``--verbose``: where the memory goes per component, the per-candidate bars, every reason and
  every assumption (``print_plan(verbose=True)``).

A candidate on a device mesh is named by its mesh everywhere (``candidate_label``): ``zero3 cp 8``.
The planner decides; this module only lays out what it returned (``--json`` is the whole record).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from advisor.planning.render import headline_reason, remedy_basis, remedy_line, remedy_sections, render
from advisor.planning.smallest import unfit_subject
from advisor.cli.render import gib, terminal_console
from advisor.units import GIB

_MOMENT_LABELS = {"start_of_forward": "start of fwd", "end_of_forward": "end of fwd", "loss_backward": "loss bwd",
                  "block_backward": "block bwd", "end_of_backward": "end of bwd", "optimizer_step": "optim step"}
_WHERE = {"none": "GPU", "optimizer": "CPU*", "all": "CPU"}
# Short mesh dimension names for a narrow table (``dp`` is dp_shard, as in ``ParallelDims.label``'s ``dp 8``).
_SHORT_DIMS = {"pp": "pp", "dp_replicate": "rep", "dp_shard": "dp", "cp": "cp", "tp": "tp"}


def plan_title(plan) -> str:
    """``Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM (79.15 GiB each): bf16-mixed, adamw, seq 2048, torch engine``."""
    hw = plan.hardware
    nodes = f"{hw.nodes} nodes x " if hw.nodes > 1 else ""
    t = plan.training
    return (f"{plan.model.name} on {nodes}{hw.gpus_per_node} x {hw.gpu.name} ({gib(hw.gpu_memory_bytes)} GiB each): "
            f"{t.precision}, {t.optimizer}, seq {t.seq_len}, {t.engine} engine")


def candidate_label(candidate, *, short: bool = False) -> str:
    """``zero3``, or ``zero3 cp 8 x tp 2`` for a candidate on a device mesh (``zero3 cp8 tp2`` when ``short``)."""
    mesh = candidate.mesh
    if mesh is None:
        return candidate.strategy
    if short and not mesh.is_data_parallel_only:
        text = " ".join(f"{_SHORT_DIMS[n]}{d}" for n, d in mesh.shape.items())
        if mesh.pp > 1 and mesh.pp_schedule != "1f1b":
            text = text.replace(f"pp{mesh.pp}", f"pp{mesh.pp}({mesh.pp_schedule})", 1)
        return f"{candidate.strategy} {text}" + (f" ep{mesh.ep}" if mesh.ep > 1 else "")
    return f"{candidate.strategy} {mesh.label}"


def is_recommended(plan, candidate) -> bool:
    rec = plan.recommendation
    return rec is not None and candidate.strategy == rec.strategy and candidate.mesh == rec.mesh


def recommended_candidate(plan):
    return next((c for c in plan.candidates if is_recommended(plan, c)), None)


# --- the answer ------------------------------------------------------------------------------------

def answer_lines(plan) -> list[str]:
    """The recommendation with its figures, then one line of why (rich markup)."""
    rec = plan.recommendation
    if rec is None:
        found = plan.smallest_fit.message if plan.smallest_fit is not None else ""
        subject, at = unfit_subject(plan)
        if subject.startswith(("nothing", "no mesh")):  # a strategy's name keeps its case
            subject = subject[0].upper() + subject[1:]
        lines = [f"[bold red]{subject}{at}.[/] {found}".rstrip()]
        unfit = [x for x in plan.reasons if type(x).__name__ in _UNFIT]
        if len(unfit) > 1 and type(unfit[-1]).__name__ == "NoMeshFits":  # it names no figure: the shortfall before it
            unfit = unfit[:-1]
        # the best remedy the planner found (its first RemedyFits, ranked as the remedies are): where one fits, the
        # count search's hint ("shorten --seq-len") is not the only way out
        remedy = next((x for x in plan.reasons if type(x).__name__ == "RemedyFits"), None)
        return lines + ([f"[bold]Why:[/] {render(unfit[-1])}"] if unfit else []) + (
            [f"[bold]Instead:[/] {render(remedy)}"] if remedy is not None else [])
    ckpt = (f", {'selective ' if rec.selective_checkpointing else ''}activation checkpointing"
            if rec.activation_checkpointing else "")
    accum = (f", {rec.gradient_accumulation_steps} accumulation steps"
             if rec.gradient_accumulation_steps and rec.gradient_accumulation_steps > 1 else "")
    mesh = f" on mesh {rec.mesh.label}" if rec.mesh is not None else ""
    figures = ""
    chosen = recommended_candidate(plan)
    if chosen is not None and chosen.memory_bytes is not None:
        total = chosen.memory_bytes.total
        figures = f": {gib(total)} of {gib(chosen.capacity_bytes)} GiB per GPU ({total / chosen.capacity_bytes:.0%})"
        margin = plan.training.margin
        if margin != "expected" and chosen.memory_range is not None:  # the end that decided the fit, said first
            judged = chosen.memory_range.at(margin)
            figures = (f": {gib(judged)} of {gib(chosen.capacity_bytes)} GiB per GPU at the {margin} end of its range "
                       f"({judged / chosen.capacity_bytes:.0%}; expected {gib(total)})")
        step = chosen.step_time
        if step is not None:
            figures += f", {step.step_s:.2f} s/step, {step.tokens_per_s:,.0f} tokens/s"
    return [f"[bold]Recommendation:[/] {rec.strategy} ({rec.engine}){mesh}, micro-batch {rec.micro_batch_size}"
            f"{ckpt}{accum}{figures}",
            f"[bold]Why:[/] {headline_reason(plan)}"]


# Why nothing fits: a candidate's or a mesh's shortfall (the smallest count that would fit is said already).
# By class name (none of these is subclassed): naming the mesh reasons' classes here would import them on every
# plan (advisor.planning.reasons loads them on first use).
_UNFIT = ("DoesNotFit", "HighEndDoesNotFit", "CpuRamDoesNotFit", "SizeDefaultUnfit", "NoMeshFits", "NoPinnedMeshFits",
          "NoGpuOnlyMesh")
# --- the table -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable  # candidate -> str (only called for available candidates)
    optional: bool = True  # may be dropped when the terminal is narrow


@dataclass(frozen=True)
class _Layout:
    """What the table shows: columns left out, the peak's range, mesh names in full or short."""
    dropped: frozenset = frozenset()
    peak_range: bool = True
    short_names: bool = False


# What goes first when the terminal is narrow, in order; the strategy, fits and peak columns stay.
_NARROWING = ("range", "offload %", "comm %", "MFU", "CPU GiB/node", "ckpt", "short names", "% of GPU", "step s",
              "max seq", "mbs", "tok/s")


def _fits_mark(candidate) -> str:
    if not candidate.available:
        return "n/a"
    return "[green]yes[/]" if candidate.fits else "[red]no[/]"


def _ckpt_cell(candidate) -> str:
    """on, sel (selective: keeps attention outputs and every other matmul) or off."""
    if not candidate.activation_checkpointing:
        return "off"
    return "sel" if candidate.selective_checkpointing else "on"


def _with_range(total: int, memory_range) -> str:
    """``31.20 (30.10-33.00)``: the estimate and its measured range, GiB."""
    if memory_range is None:
        return gib(total)
    return f"{gib(total)} ({memory_range.low / GIB:.1f}-{memory_range.high / GIB:.1f})"


def timing_cells(step) -> tuple[str, str, str, str, str]:
    """Step time, global tokens/s, MFU, and the shares of the step in exposed collectives and in offload."""
    if step is None:
        return "-", "-", "-", "-", "-"
    def share(seconds: float) -> str:
        return f"{seconds / step.step_s:.0%}" if step.step_s else "-"
    return (f"{step.step_s:.2f}", f"{step.tokens_per_s:,.0f}", f"{step.mfu:.0%}", share(step.exposed_communication_s),
            share(step.exposed_offload_s))


def _columns(plan, layout: _Layout) -> list[_Column]:
    longest = plan.longest_seq_len or {}
    timing = lambda i: lambda c: timing_cells(c.step_time)[i]  # noqa: E731
    peak = ((lambda c: _with_range(c.memory_bytes.total, c.memory_range)) if layout.peak_range
            else (lambda c: gib(c.memory_bytes.total)))
    columns = [
        _Column("max seq", lambda c: f"{plan.longest_for(c):,}" if plan.longest_for(c) else "-"),
        _Column("peak GiB", peak, optional=False),
        _Column("% of GPU", lambda c: f"{c.memory_bytes.total / c.capacity_bytes:.0%}"),
        _Column("mbs", lambda c: str(c.micro_batch_size)),
        _Column("ckpt", _ckpt_cell),
        _Column("CPU GiB/node", lambda c: gib(c.cpu_memory_bytes) if c.cpu_memory_bytes else "-"),
        _Column("step s", timing(0)), _Column("tok/s", timing(1)), _Column("MFU", timing(2)),
        _Column("comm %", timing(3)), _Column("offload %", timing(4)),
    ]
    if not longest:
        columns = columns[1:]
    if not any(c.cpu_memory_bytes for c in plan.candidates if c.available):
        columns = [col for col in columns if col.header != "CPU GiB/node"]  # nothing offloads: an empty column
    return [col for col in columns if col.header not in layout.dropped]


def _table(plan, layout: _Layout) -> Table:
    table = Table(title=plan_title(plan), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, caption_justify="left", title_style="bold")
    columns = _columns(plan, layout)
    table.add_column("strategy", no_wrap=True)
    table.add_column("fits", justify="right", no_wrap=True)
    for col in columns:
        table.add_column(col.header, justify="right", no_wrap=True)
    for c in plan.candidates:
        label = candidate_label(c, short=layout.short_names)
        name = f"[bold]{label}[/] *" if is_recommended(plan, c) else label
        cells = [col.cell(c) for col in columns] if c.available else ["-"] * len(columns)
        table.add_row(name, _fits_mark(c), *cells)
    return table


def _caption(plan, layout: _Layout, width: int | None) -> str:
    lines = [("* recommended. " if plan.recommendation is not None else "")
             + "peak: per GPU, with the allocator gap and CUDA context"
             + (" (low-high: measured error range)" if layout.peak_range else "") + "."]
    if layout.short_names:
        used = {n for c in plan.candidates if c.mesh is not None and not c.mesh.is_data_parallel_only
                for n in c.mesh.shape if _SHORT_DIMS[n] != n}
        if used:
            lines.append("mesh names: " + ", ".join(f"{_SHORT_DIMS[n]}N = {n} N" for n in sorted(used, reverse=True))
                         + " (cp, tp as they are).")
    hidden = ([] if layout.peak_range else ["range"]) + [col.header for col in _columns(plan, _Layout())
                                                          if col.header in layout.dropped]
    if hidden and width is not None:
        lines.append(f"Not shown at {width} columns: {', '.join(hidden)} (a wider terminal or --json).")
    unavailable: dict[str | None, list[str]] = {}  # one line a reason, naming every row it holds for
    for c in plan.candidates:
        if not c.available:
            unavailable.setdefault(c.unavailable_reason, []).append(candidate_label(c))
    lines += [f"n/a {', '.join(labels)}: {reason}" for reason, labels in unavailable.items()]
    return "\n".join(lines)


def _narrower(layout: _Layout, step: str) -> _Layout:
    if step == "range":
        return replace(layout, peak_range=False)
    if step == "short names":
        return replace(layout, short_names=True)
    return replace(layout, dropped=layout.dropped | {step})


def _natural_width(console: Console, table: Table, widths: dict[str, int]) -> int:
    """Columns the table takes when nothing limits it: what rich's ``Measurement`` of the whole table gives
    for the layout of the plan table and the breakdown (no edge, no edge padding, one space each side
    inside, a one-column rule between columns; tests/cli/test_render.py compares the two), summed from each
    cell's width, kept in ``widths`` across the narrowing steps. Measuring the whole table at every step
    measured every cell twice, six times over at 80 columns: two thirds of printing a plan."""
    options = console.options.update_width(10_000)  # Measurement.get caps at the console's width
    total = len(table.columns) - 1  # the rules between columns
    for index, column in enumerate(table.columns):
        cells = (column.header, *column.cells)
        for cell in cells:
            if cell not in widths:
                widths[cell] = Measurement.get(console, options, cell).maximum
        total += max(widths[cell] for cell in cells) + (index > 0) + (index < len(table.columns) - 1)
    return total


def plan_table(plan, *, width: int | None = None, console: Console | None = None) -> Table:
    """Per candidate: does it fit, the per-GPU peak, the settings chosen and the step time. With ``width``,
    the least needed columns go (``_NARROWING``) until the table is at most that wide."""
    layout = _Layout()
    table = _table(plan, layout)
    if width is not None:
        console = console or Console(width=max(width, 20), emoji=False)
        steps, widths = iter(_NARROWING), {}
        while _natural_width(console, table, widths) > width:
            step = next(steps, None)
            if step is None:
                break  # only strategy, fits and peak left: rich wraps what remains
            layout = _narrower(layout, step)
            table = _table(plan, layout)
    table.caption = _caption(plan, layout, width)
    return table


# --- behind --verbose ------------------------------------------------------------------------------

def memory_table(plan) -> Table:
    """Two views per strategy: model states at rest (the same at every moment) and the peak moment's breakdown."""
    table = Table(title="Where the memory goes, GiB per GPU: model states at rest (ZeRO accounting, every "
                  "moment), then what is live at the peak moment", title_justify="left",
                  caption="rest on: where the resting states live (CPU*: gradients and optimizer state on the CPU, "
                          "weights on the GPU). alloc gap: reserved minus allocated, calibrated on measured runs "
                          "(profiles/allocator_overhead.json), without FSDP's gradient blocks cached for its "
                          "reduce-scatter stream and the blocks cached around recomputation under checkpointing, which "
                          "torch counts as reserved too but frees before an allocation fails (gradient_stream_pool, "
                          "recompute_cache in --json); context: CUDA context and NCCL buffers outside the "
                          "allocator, measured on an H100, assumed elsewhere (--context-gib)", caption_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("strategy", "rest params", "rest grads", "rest optim", "rest on", "peak moment", "params", "grads",
                "optim", "activ", "temp", "alloc gap", "context", "peak GiB"):
        table.add_column(col, justify="left" if col in ("strategy", "rest on", "peak moment") else "right",
                         no_wrap=True)
    for c in plan.candidates:
        if not c.available:
            continue
        m = c.memory_bytes
        table.add_row(candidate_label(c), gib(m.states_params), gib(m.states_grads), gib(m.states_optimizer),
                      _WHERE[m.states_on_cpu], _MOMENT_LABELS[m.peak_moment], gib(m.params), gib(m.grads),
                      gib(m.optimizer), gib(m.activations), gib(m.temporary), gib(m.allocator_gap),
                      gib(m.outside_allocator), gib(m.total))
    return table


PLAN_NOTES = ("peak = estimated peak allocated + allocator gap + CUDA context, per GPU (low-high: the range measured "
              "errors of this kind of estimate give; --margin picks the end that decides fits). comm %: share of the "
              "step in exposed collectives (NVLink / network); offload %: exposed PCIe host<->device transfers and "
              "the CPU optimizer step.")


def memory_bars(plan, *, width: int = 40) -> list[str]:
    """One bar per candidate, labels aligned: per-GPU total against the GPU's capacity (| marks capacity)."""
    rows = [c for c in plan.candidates if c.available]
    if not rows:
        return []
    capacity = rows[0].capacity_bytes
    scale = max(capacity, *(min(c.memory_bytes.total, 4 * capacity) for c in rows))
    cap_at = round(width * capacity / scale)
    pad = max(len(candidate_label(c)) for c in rows)
    lines = []
    for c in rows:
        filled = min(width, round(width * c.memory_bytes.total / scale))
        bar = ["#" if i < filled else "." for i in range(width)]
        if cap_at < width:
            bar[cap_at] = "|"
        overflow = ">" if c.memory_bytes.total > scale else " "
        colour = "green" if c.fits else "red"
        pct = 100 * c.memory_bytes.total / capacity
        lines.append(f"{candidate_label(c):>{pad}} [{colour}]{''.join(bar)}[/]{overflow} {pct:5.0f}% of {gib(capacity)} GiB")
    return lines


def _bar_width(plan, columns: int) -> int:
    """What is left of the terminal for the bars: label, space, bar, overflow mark, `` 2669% of 79.18 GiB``."""
    rows = [c for c in plan.candidates if c.available]
    pad = max((len(candidate_label(c)) for c in rows), default=0)
    tail = len(f"  {100:5.0f}% of {gib(plan.hardware.gpu_memory_bytes)} GiB")
    return max(10, min(40, columns - pad - 1 - tail))


def print_plan(plan, *, verbose: bool = False, console: Console | None = None) -> None:
    """The answer, the table at the terminal's width, and (``verbose``) the breakdown, bars, why and
    assumptions; otherwise one line saying what ``--verbose`` adds."""
    # highlight=False everywhere: nothing here is for rich's highlighter, and skipping it saves compiling
    # its regular expressions (~5 ms of every `advisor plan`).
    console = console or terminal_console()
    for line in answer_lines(plan):
        console.print(line, highlight=False)
    console.print()
    console.print(plan_table(plan, width=console.width, console=console), highlight=False)
    remedies = plan.recommendation.remedies if plan.recommendation is not None else ()
    if not verbose:
        if remedies:
            shown = (f"the best 3 of {len(remedies)}, --verbose lists all; " if len(remedies) > 3 else "")
            console.print(f"[bold]Remedies[/] ({shown}{remedy_basis(remedies)}):", highlight=False)
            console.print(_bullets([f"{remedy_line(r)}{'' if r.keeps_math else ' (changes the mathematics)'}"
                                    for r in remedies[:3]]), highlight=False)
        reasons, assumptions = len(plan.why), len(plan.assumptions)
        console.print(f"--verbose: memory per component, bars, {reasons} reason{'s' if reasons != 1 else ''}, "
                      f"{assumptions} assumption{'s' if assumptions != 1 else ''}.", highlight=False)
        return
    console.print(PLAN_NOTES, highlight=False)
    console.print()
    breakdown = memory_table(plan)
    natural = _natural_width(console, breakdown, {})
    # Wider than the terminal: printed whole (the terminal wraps it) rather than with its figures cut.
    wide = console if natural <= console.width else Console(file=console.file, width=natural, emoji=False,
                                                             color_system=console.color_system)
    wide.print(breakdown, highlight=False)
    console.print()
    for line in memory_bars(plan, width=_bar_width(plan, console.width)):
        console.print(line, highlight=False)
    console.print()
    staged = [c for c in plan.candidates if getattr(c, "stage_peaks", None)]
    if staged:  # pipeline meshes: every rank's peak, the worst decides the fit
        console.print("[bold]Per-stage peaks[/] (GiB per GPU, pipeline rank 0 first):", highlight=False)
        console.print(_bullets([f"{candidate_label(c)}: {', '.join(f'{p / GIB:.1f}' for p in c.stage_peaks)}"
                                for c in staged]), highlight=False)
        console.print()
    sections = [(f"{heading} ({remedy_basis(remedies)})" if i == 0 else heading, lines)
                for i, (heading, lines) in enumerate(remedy_sections(remedies))]  # the basis once, on the first
    for heading, lines in (("Why", plan.why), *sections, ("Assumptions", plan.assumptions)):
        console.print(f"[bold]{heading}:[/]", highlight=False)
        console.print(_bullets(lines), highlight=False)


def _bullets(lines) -> Table:
    """A list whose wrapped lines stay indented under their first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for line in lines:
        grid.add_row("  -", line)
    return grid
