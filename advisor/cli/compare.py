"""``advisor compare``: the same job on several clusters side by side. A thin skin over
``advisor.planning.compare.compare``; registered on the ``advisor`` group in ``advisor/cli/main.py``."""

from __future__ import annotations

import json

import click

from advisor.cli.options import plan_kwargs, plan_options
from advisor.units import GIB


def _checkpointing_suffix(result) -> str:
    """`` +SAC`` for selective activation checkpointing, `` +AC`` for full recomputation."""
    if not result.activation_checkpointing:
        return ""
    return " +SAC" if result.selective_checkpointing else " +AC"


def _table(comparison):
    from rich.table import Table

    table = Table(title=f"{comparison.model}: {comparison.total_params / 1e9:.3g}B parameters")
    for header in ("cluster", "GPUs", "strategy", "micro", "GiB/GPU", "step s", "tokens/s", "MFU", "GPU-h/1B tok"):
        table.add_column(header, justify="left" if header in ("cluster", "strategy") else "right", no_wrap=True)
    for r in comparison.results:
        if not r.fits:
            table.add_row(r.label, str(r.world_size), "does not fit", "-", "-", "-", "-", "-", "-")
            continue
        step = r.step
        micro = f"{r.micro_batch_size}" + (f" x{r.gradient_accumulation_steps}" if r.gradient_accumulation_steps > 1 else "")
        table.add_row(
            r.label, str(r.world_size), r.strategy + _checkpointing_suffix(r), micro,
            f"{r.memory_per_gpu_bytes / GIB:.1f}/{r.capacity_bytes / GIB:.0f}", f"{step.step_s:.2f}",
            f"{step.tokens_per_s:,.0f}", f"{step.mfu:.0%}", f"{r.gpu_hours_per_billion_tokens:,.1f}",
        )
    return table


def _json(comparison) -> str:
    doc = comparison.model_dump(mode="json")
    for row, result in zip(doc["results"], comparison.results):
        if result.step is not None:
            row["step"]["tokens_per_s_per_gpu"] = result.step.tokens_per_s_per_gpu
    doc["fastest"] = comparison.fastest.gpus if comparison.fastest else None
    doc["cheapest"] = comparison.cheapest.gpus if comparison.cheapest else None
    return json.dumps(doc, indent=2)


@click.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document.")
def compare(as_json: bool, **options) -> None:
    """Plan and time the same model on several clusters: --gpus takes a comma-separated list.

    \b
    advisor compare --model meta-llama/Llama-3.1-8B --gpus 2xA100,4xA100,8xH100
    advisor compare --params 13B --gpus 8xA100,2x8xA100,8xH100 --seq-len 4096 --json

    Per cluster: the recommended strategy, memory per GPU, step time, tokens/s, MFU and GPU-hours per
    billion tokens (estimates; see benchmarks/results/throughput_validation.md for their accuracy).
    """
    from advisor.planning.compare import compare as run_compare, split_gpus

    items = split_gpus(options["gpus"])
    kwargs = plan_kwargs(options)
    model, nodes, interconnect = kwargs.pop("model"), kwargs.pop("nodes"), kwargs.pop("interconnect")
    kwargs.pop("gpus")
    result = run_compare(model, items, nodes=nodes, interconnect=interconnect, **kwargs)
    if as_json:
        click.echo(_json(result))
        return
    from advisor.cli.render import wide_console

    console = wide_console(112)  # nine numeric columns: don't squeeze them when piped
    console.print(_table(result))
    fastest, cheapest = result.fastest, result.cheapest
    if fastest is not None:
        console.print(f"Fastest: {fastest.label} ({fastest.step.tokens_per_s:,.0f} tokens/s). "
                      f"Cheapest per token: {cheapest.label} ({cheapest.gpu_hours_per_billion_tokens:,.1f} GPU-hours "
                      "per billion tokens).")
    for r in result.results:
        if not r.fits:
            console.print(f"{r.label}: {r.message}")
