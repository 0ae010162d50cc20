"""Terminal rendering (rich) of specs and GPU lists, the number formats and the consoles every
command prints with (a plan's own layout is ``advisor.cli.plan_view``). Formatting lives in
``advisor.cli`` and only there: the library returns integer bytes and counts."""

from __future__ import annotations

import shutil
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
        ("expert intermediate size" if spec.num_experts else "intermediate size", spec.intermediate_size, None),
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


def terminal_console() -> Console:
    """A console as wide as the terminal: ``COLUMNS`` when set, else the terminal's own width, else 80
    (a pipe), as ``shutil.get_terminal_size`` reads them. Width and height are both given, for the
    reason ``wide_console`` explains."""
    size = shutil.get_terminal_size()
    return Console(width=max(size.columns, 20), height=size.lines, emoji=False)


def print_table(table: Table, *, console: Console | None = None) -> None:
    (console or wide_console()).print(table)


