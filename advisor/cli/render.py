"""Terminal rendering (rich) of specs, GPU lists and plans. Formatting lives here and only here:
the library returns integer bytes and counts."""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.table import Table

from advisor.model.spec import ModelSpec
from advisor.hardware.catalog import GpuProfile, Interconnect
from advisor.units import GIB



def human_count(n: int | None) -> str:
    if n is None:
        return "-"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def gib(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / GIB:.2f}"


def spec_table(spec: ModelSpec) -> Table:
    table = Table(title=f"{spec.name}", show_header=True, title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_column("exact", justify="right")
    rows = [
        ("architecture", spec.architecture, None),
        ("model type", spec.model_type, None),
        ("source", f"{spec.source} ({spec.count_method})", None),
        ("total parameters", human_count(spec.total_params), spec.total_params),
        ("trainable parameters", human_count(spec.trainable_params), spec.trainable_params),
    ]
    if spec.num_experts:
        rows.append(("active per token", human_count(spec.active_params), spec.active_params))
    rows += [
        ("embeddings", human_count(spec.embedding_params), spec.embedding_params),
        ("one block", human_count(spec.layer_params), spec.layer_params),
        ("head", "tied" if spec.tied_embeddings else human_count(spec.head_params), spec.head_params),
        ("other (norms, positions)", human_count(spec.other_params), spec.other_params),
        ("layers", spec.num_layers, None),
        ("hidden size", spec.hidden_size, None),
        ("attention heads", spec.num_attention_heads, None),
        ("KV heads", spec.num_kv_heads, None),
        ("head dim", spec.head_dim, None),
        ("intermediate size", spec.intermediate_size, None),
        ("vocabulary", spec.vocab_size, None),
        ("experts (active)", f"{spec.num_experts} ({spec.num_experts_per_token})" if spec.num_experts else None, None),
        ("block classes", ", ".join(spec.block_classes) or None, None),
        ("dtype", spec.dtype, None),
    ]
    for label, value, exact in rows:
        if value is None:
            continue
        table.add_row(label, str(value), f"{exact:,}" if isinstance(exact, int) else "")
    return table


def gpu_table(gpus: Iterable[GpuProfile], links: dict[str, Interconnect]) -> Table:
    table = Table(title="GPU profiles", title_justify="left")
    for col in ("name", "memory GiB", "bf16 TFLOPS", "fp32 TFLOPS", "HBM GB/s", "link", "link GB/s"):
        table.add_column(col, justify="left" if col in ("name", "link") else "right")
    for g in gpus:
        link = links.get(g.intra_node_link)
        table.add_row(
            g.name,
            gib(g.memory_bytes),
            "-" if g.bf16_tflops is None else f"{g.bf16_tflops:g}",
            f"{g.fp32_tflops:g}",
            f"{g.hbm_bandwidth_gbps:g}",
            g.intra_node_link,
            "-" if link is None else f"{link.bandwidth_gbps:g}",
        )
    return table


def wide_console(min_width: int = 120) -> Console:
    """A console at least ``min_width`` columns wide, whatever the terminal says (pipes report 80).

    Both width and height are given: with only a width, rich still runs its own size detection and,
    on a terminal it takes for dumb (TERM=dumb or unknown while FORCE_COLOR or TTY_COMPATIBLE=1 makes
    it a terminal), returns 80 columns and ignores the width asked for, so wide tables are squeezed
    and their headers cut ("GPU-h/1B…").

    ``emoji=False``: nothing we print is an emoji code, and with codes on rich would turn a ``:name:``
    inside a model id or path into a pictogram (and load its emoji table on every run)."""
    width, height = Console().size
    return Console(width=max(width, min_width), height=height, emoji=False)


def print_table(table: Table, *, console: Console | None = None) -> None:
    (console or wide_console()).print(table)


def _fits_mark(candidate) -> str:
    if not candidate.available:
        return "n/a"
    return "[green]yes[/]" if candidate.fits else "[red]no[/]"


_MOMENT_LABELS = {"start_of_forward": "start of fwd", "end_of_forward": "end of fwd", "loss_backward": "loss bwd",
                  "block_backward": "block bwd", "end_of_backward": "end of bwd", "optimizer_step": "optim step"}
_WHERE = {"none": "GPU", "optimizer": "CPU*", "all": "CPU"}


def plan_title(plan) -> str:
    """``Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM (79.15 GiB each): bf16-mixed, adamw, seq 2048, torch engine``."""
    hw = plan.hardware
    nodes = f"{hw.nodes} nodes x " if hw.nodes > 1 else ""
    t = plan.training
    return (f"{plan.model.name} on {nodes}{hw.gpus_per_node} x {hw.gpu.name} ({gib(hw.gpu_memory_bytes)} GiB each): "
            f"{t.precision}, {t.optimizer}, seq {t.seq_len}, {t.engine} engine")


def candidate_label(candidate) -> str:
    """``zero3``, or ``zero3 cp 8 x tp 2`` for a candidate on a device mesh."""
    mesh = candidate.mesh
    return candidate.strategy if mesh is None else f"{candidate.strategy} {mesh.label}"


def _is_recommended(plan, candidate) -> bool:
    rec = plan.recommendation
    return rec is not None and candidate.strategy == rec.strategy and candidate.mesh == rec.mesh


def _ckpt_cell(candidate) -> str:
    """on, sel (selective: keeps attention outputs and every other matmul) or off."""
    if not candidate.activation_checkpointing:
        return "off"
    return "sel" if candidate.selective_checkpointing else "on"


def plan_table(plan) -> Table:
    """Per strategy: does it fit, the per-GPU peak, the settings chosen, and the step time."""
    unavailable = [f"{candidate_label(c)}: {c.unavailable_reason}" for c in plan.candidates if not c.available]
    table = Table(title=f"{plan_title(plan)}\nPer-GPU peak memory and step time", title_justify="left",
                  caption="peak = estimated peak allocated + allocator gap + CUDA context, per GPU (low-high: the range measured errors "
                          "of this kind of estimate give; --margin picks the end that decides fits). comm %: share of the step "
                          "in exposed collectives (NVLink / network); offload %: exposed PCIe host<->device "
                          "transfers and the CPU optimizer step." + "".join(f"\nn/a {u}" for u in unavailable),
                  caption_justify="left")
    longest = plan.longest_seq_len or {}
    columns = ["strategy", "fits", *(["max seq"] if longest else []), "peak GiB", "% of GPU", "mbs", "ckpt",
               "CPU GiB/node", "step s", "tok/s", "MFU", "comm %", "offload %"]
    for col in columns:
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for c in plan.candidates:
        name = f"[bold]{candidate_label(c)}[/] *" if _is_recommended(plan, c) else candidate_label(c)
        seq = [f"{longest[candidate_label(c)]:,}" if longest.get(candidate_label(c)) else "-"] if longest else []
        if not c.available:
            table.add_row(name, _fits_mark(c), *seq, *["-"] * 10)  # the reason is in the caption
            continue
        m = c.memory_bytes
        table.add_row(
            name, _fits_mark(c), *seq, _with_range(m.total, c.memory_range), f"{m.total / c.capacity_bytes:.0%}",
            str(c.micro_batch_size), _ckpt_cell(c),
            gib(c.cpu_memory_bytes) if c.cpu_memory_bytes else "-", *_timing_cells(c.step_time),
        )
    return table


def _with_range(total: int, memory_range) -> str:
    """``31.20 (30.10-33.00)``: the estimate and its measured range, GiB."""
    if memory_range is None:
        return gib(total)
    return f"{gib(total)} ({memory_range.low / GIB:.1f}-{memory_range.high / GIB:.1f})"


def memory_table(plan) -> Table:
    """Two views per strategy: model states at rest (the same at every moment) and the peak moment's breakdown."""
    table = Table(title="Where the memory goes, GiB per GPU: model states at rest (ZeRO accounting, every "
                  "moment), then what is live at the peak moment", title_justify="left",
                  caption="rest on: where the resting states live (CPU*: gradients and optimizer state on the CPU, "
                          "weights on the GPU). alloc gap: reserved minus allocated, calibrated on measured runs "
                          "(profiles/allocator_overhead.json); context: CUDA context and NCCL buffers outside the "
                          "allocator, an assumption (--context-gib)", caption_justify="left")
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


def _timing_cells(step) -> tuple[str, str, str, str, str]:
    """Step time, global tokens/s, MFU, and the shares of the step in exposed collectives and in offload."""
    if step is None:
        return "-", "-", "-", "-", "-"
    def share(seconds: float) -> str:
        return f"{seconds / step.step_s:.0%}" if step.step_s else "-"
    return (f"{step.step_s:.2f}", f"{step.tokens_per_s:,.0f}", f"{step.mfu:.0%}", share(step.exposed_communication_s),
            share(step.exposed_offload_s))


def memory_bars(plan, *, width: int = 40) -> list[str]:
    """One bar per candidate: per-GPU total against the GPU's capacity (| marks capacity)."""
    rows = [c for c in plan.candidates if c.available]
    if not rows:
        return []
    capacity = rows[0].capacity_bytes
    scale = max(capacity, *(min(c.memory_bytes.total, 4 * capacity) for c in rows))
    cap_at = round(width * capacity / scale)
    lines = []
    for c in rows:
        filled = min(width, round(width * c.memory_bytes.total / scale))
        bar = ["#" if i < filled else "." for i in range(width)]
        if cap_at < width:
            bar[cap_at] = "|"
        overflow = ">" if c.memory_bytes.total > scale else " "
        colour = "green" if c.fits else "red"
        pct = 100 * c.memory_bytes.total / capacity
        lines.append(f"{candidate_label(c):>14} [{colour}]{''.join(bar)}[/]{overflow} {pct:5.0f}% of {gib(capacity)} GiB")
    return lines


def print_plan(plan, *, console: Console | None = None) -> None:
    console = console or wide_console(160)
    console.print(plan_table(plan))
    console.print()
    console.print(memory_table(plan))
    console.print()
    for line in memory_bars(plan):
        console.print(line, highlight=False)
    console.print()
    rec = plan.recommendation
    if rec is not None:
        ckpt = (f", {'selective ' if rec.selective_checkpointing else ''}activation checkpointing"
                if rec.activation_checkpointing else "")
        accum = (f", {rec.gradient_accumulation_steps} accumulation steps"
                 if rec.gradient_accumulation_steps and rec.gradient_accumulation_steps > 1 else "")
        mesh = f" on mesh {rec.mesh.label}" if rec.mesh is not None else ""
        console.print(f"[bold]Recommendation:[/] {rec.strategy} ({rec.engine}){mesh}, micro-batch {rec.micro_batch_size}"
                      f"{ckpt}{accum}", highlight=False)
    else:
        console.print("[bold red]Nothing fits.[/]", highlight=False)
    # highlight=False everywhere: the headers hold nothing rich's highlighter marks, and skipping it
    # saves compiling its regular expressions (~5 ms of every `advisor plan`).
    console.print("[bold]Why:[/]", highlight=False)
    for line in plan.why:
        console.print(f"  - {line}", highlight=False)
    console.print("[bold]Assumptions:[/]", highlight=False)
    for line in plan.assumptions:
        console.print(f"  - {line}", highlight=False)
