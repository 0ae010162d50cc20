"""``advisor compare``: the same job on several clusters side by side. A thin skin over
``advisor.planning.compare.compare``; registered on the ``advisor`` group in ``advisor/cli/main.py``."""

from __future__ import annotations

import functools
import json

import click

from advisor.cli.options import (EXIT_NOTHING_FITS, plan_kwargs, plan_options, refuse_hybrid_switch,
                                 require_local_gpus)
from advisor.hardware.cluster import has_count
from advisor.model.spec import size_label
from advisor.units import GIB


def _checkpointing_suffix(result) -> str:
    """`` +SAC`` for selective activation checkpointing, `` +AC`` for full recomputation."""
    if not result.activation_checkpointing:
        return ""
    return " +SAC" if result.selective_checkpointing else " +AC"


def _table(comparison):
    from rich.table import Table

    size = f"{size_label(comparison.total_params)} parameters"
    table = Table(title=comparison.model if comparison.model == size else f"{comparison.model}: {size}")
    for header in ("cluster", "GPUs", "strategy", "micro", "GiB/GPU", "step s", "tokens/s", "MFU", "GPU-h/1B tok"):
        table.add_column(header, justify="left" if header in ("cluster", "strategy") else "right", no_wrap=True)
    for r in comparison.results:
        if not r.fits:
            table.add_row(r.label, str(r.world_size), "does not fit", "-", "-", "-", "-", "-", "-")
            continue
        step = r.step
        micro = f"{r.micro_batch_size}" + (f" x{r.gradient_accumulation_steps}" if r.gradient_accumulation_steps > 1 else "")
        table.add_row(
            r.label, str(r.world_size), r.strategy + (f" {r.mesh}" if r.mesh else "") + _checkpointing_suffix(r), micro,
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


def _from_file(items: list[str], options: dict) -> tuple[list[str], dict]:
    """--from FILE beside a list of clusters: the file's settings under the options typed, its process count given to
    each cluster named without one (``--gpus A100,H100`` and 8 processes: 8 x A100, 8 x H100), its global batch kept
    on every cluster; a gradient accumulation, which gives a different global batch on each, is said and not used."""
    from advisor.cli.from_file import apply_config_file, summary_lines

    merged, done = apply_config_file(options["from_file"], {**options, "gpus": None}, need_gpus=False)
    settings = done.config.settings
    world, nodes = settings.get("num_gpus"), settings.get("nodes")
    if world is not None:
        per_node, typed_nodes = int(world) // int(nodes or 1), options.get("nodes")
        # --nodes typed wins over the file's machines (as plan takes it): the file gives the GPUs per node only
        prefix = f"{nodes}x{per_node}x" if nodes not in (None, 1) and typed_nodes is None else f"{per_node}x"
        counted = [item for item in items if has_count(item)]
        items = [item if item in counted else prefix + item for item in items]
    if settings.get("global_batch") is not None and merged.get("global_batch") is None:
        merged["global_batch"] = int(settings["global_batch"])
    notes = summary_lines(done)
    if world is not None and counted:
        notes.append(f"--from: the counts in --gpus ({', '.join(counted)}) override the file's {world} processes")
    if world is not None and options.get("nodes") is not None and int(nodes or 1) != options["nodes"]:
        notes.append(f"--from: --nodes {options['nodes']} given overrides the file's {nodes or 1} machines")
    if settings.get("gradient_accumulation") is not None and merged.get("global_batch") is None:
        notes.append(f"--from: gradient accumulation {settings['gradient_accumulation']} is not used (it gives another "
                     "global batch on each cluster): pass --global-batch")
    for line in notes:
        click.echo(f"advisor: note: {line}", err=True)
    return items, {**merged, "gpus": options["gpus"], "from_file": None}


# Several clusters: a comma-separated list, or --gpus repeated (each value may itself be a list).
_CLUSTERS = click.option("--gpus", "-g", multiple=True, callback=lambda ctx, param, values: ",".join(values) or None,
                         help="Clusters to compare: 2xA100,8xH100 or --gpus 2xA100 --gpus 8xH100 (see `advisor gpus`); "
                              "default: this machine's GPUs.")


@click.command()
@functools.partial(plan_options, gpus=_CLUSTERS)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document.")
def compare(as_json: bool, **options) -> None:
    """Plan and time the same model on several clusters: --gpus takes a comma-separated list, or repeats.

    \b
    advisor compare --model meta-llama/Llama-3.1-8B --gpus 2xA100,4xA100,8xH100
    advisor compare --params 13B --gpus 8xA100,2x8xA100,8xH100 --seq-len 4096 --json

    Per cluster: the recommended strategy, memory per GPU, step time, tokens/s, MFU and GPU-hours per
    billion tokens (estimates; see benchmarks/results/throughput_validation.md for their accuracy). Exit code 3 when
    no cluster listed fits.
    """
    from advisor.planning.compare import compare as run_compare, split_gpus

    refuse_hybrid_switch(options)
    if not options["gpus"]:  # the help's default: this machine's GPUs
        options["gpus"] = require_local_gpus()
    items = split_gpus(options["gpus"])
    if options.get("from_file") is not None:  # an empty --from is refused by the reader, not ignored
        items, options = _from_file(items, options)
    kwargs = plan_kwargs(options)
    model, nodes, interconnect = kwargs.pop("model"), kwargs.pop("nodes"), kwargs.pop("interconnect")
    kwargs.pop("gpus")
    result = run_compare(model, items, nodes=nodes, interconnect=interconnect, **kwargs)
    if as_json:
        click.echo(_json(result))
        if result.fastest is None:
            click.get_current_context().exit(EXIT_NOTHING_FITS)
        return
    from advisor.cli.render import wide_console

    console = wide_console(112)  # nine numeric columns: don't squeeze them when piped
    console.print(_table(result))
    fastest, cheapest = result.fastest, result.cheapest
    if fastest is not None:
        console.print(f"Fastest: {fastest.label} ({fastest.step.tokens_per_s:,.0f} tokens/s). "
                      f"Fewest GPU-hours per token: {cheapest.label} ({cheapest.gpu_hours_per_billion_tokens:,.1f} "
                      "GPU-hours per billion tokens; an hour's price differs by GPU)"
                      + ("." if fastest.within_headroom else ": every plan is past the --headroom, as below."))
    precisions = {r.precision for r in result.results if r.precision}
    if len(precisions) > 1:  # a GPU without bf16 is planned in fp16-mixed (advisor plan's assumptions say so)
        console.print("Precision differs: " + "; ".join(f"{r.label} {r.precision}" for r in result.results
                                                        if r.precision) + ".")
    for r in result.results:
        if not r.fits or r.within_headroom is False:  # nothing fits, or only within the estimate's error of an OOM
            console.print(f"{r.label}: {r.message}")
    if fastest is None:  # as advisor plan: nothing fits on any cluster listed
        click.get_current_context().exit(EXIT_NOTHING_FITS)
