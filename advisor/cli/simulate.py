"""``advisor simulate``: run the planned training step in PyTorch (fake tensors, fake process group,
on the CPU) and compare its measured per-GPU peak with the estimate. A thin skin over
``advisor.simulate.verify.verify``; registered on the ``advisor`` group in ``advisor/cli/main.py``."""

from __future__ import annotations

import json
import sys

import click

from advisor.cli.options import chart_path, plan_kwargs, plan_options
from advisor.units import GIB

_ROWS = ("params", "grads", "optimizer", "activations", "temporary", "peak_allocated")


def _table(result):
    from rich.table import Table

    sim = result.simulated
    table = Table(title=f"{sim.model}: {sim.strategy} on {sim.world_size} GPUs, micro-batch {sim.micro_batch_size}, "
                        f"seq {sim.seq_len}, checkpointing {'on' if sim.checkpointing else 'off'}")
    for header in ("GiB per GPU", "simulated", "analytic"):
        table.add_column(header, justify="left" if header == "GiB per GPU" else "right")
    for row in _ROWS:
        table.add_row(row, f"{getattr(sim, row) / GIB:.3f}", f"{getattr(result.analytic, row) / GIB:.3f}")
    table.add_row("peak during", sim.peak_phase, result.analytic.peak_phase)
    table.add_row("error", "", f"{result.error_pct:+.2f}%")
    return table


def verify_with_progress(the_plan, *, strategy: str | None = None, timeline: bool = False):
    """``advisor.simulate.verify.verify`` with a progress bar on stderr."""
    from advisor.simulate.verify import refuse_unsimulated, verify
    from advisor.simulate.step import STAGES

    refuse_unsimulated(the_plan)  # before the progress bar: a refusal is one line
    with click.progressbar(length=len(STAGES), label="simulating", file=sys.stderr) as bar:
        def progress(stage: str) -> None:
            bar.label = f"simulating: {stage}"
            bar.update(1)

        return verify(the_plan, strategy=strategy, progress=progress, timeline=timeline)


def write_timeline(result, path: str, *, force: bool) -> None:
    """The ``--timeline`` chart of a verification, written like an export (``advisor.export.write``)."""
    from advisor.cli.charts import timeline_svg
    from advisor.cli.svg import as_file
    from advisor.export.write import CHART, write_or_keep, written

    sim = result.simulated
    title = (f"{sim.model}: {sim.strategy} on {sim.world_size} GPUs, micro-batch {sim.micro_batch_size}, "
             f"seq {sim.seq_len}, checkpointing {'on' if sim.checkpointing else 'off'}")
    svg = timeline_svg(sim.timeline, title=title, moments=result.analytic.moments)
    click.echo(written(*write_or_keep(path, as_file(svg, path, title=title), force=force, **CHART)), err=True)


def print_verification(result) -> None:
    from rich.console import Console

    console = Console()
    console.print(_table(result))
    top = ", ".join(f"{m.name} ({m.phase}, {m.peak_bytes / GIB:.2f} GiB)" for m in result.simulated.top_modules[:3])
    if top:
        console.print(f"largest module peaks: {top}")
    for note in result.simulated.notes:
        console.print(f"note: {note}")


@click.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document.")
@click.option("--timeline", "timeline_file", metavar="FILE", callback=chart_path,
              help="Also write a chart of one GPU's memory over the step to FILE (a name ending .svg or .html).")
@click.option("--force", is_flag=True, help="Overwrite an existing --timeline file.")
def simulate(as_json: bool, timeline_file: str | None, force: bool, **options) -> None:
    """Run one training step of the plan in PyTorch (no GPU) and measure each rank's peak memory."""
    from advisor.planning.api import plan as make_plan

    kwargs = plan_kwargs(options)
    if kwargs.get("engine", "torch") != "torch":
        raise click.UsageError("simulate runs --engine torch only")
    if timeline_file:
        from advisor.export.write import check_destination

        check_destination(timeline_file, force=force)  # before the simulation, not after it
    result = verify_with_progress(make_plan(**kwargs), strategy=kwargs.get("strategy"), timeline=bool(timeline_file))
    if timeline_file:
        write_timeline(result, timeline_file, force=force)
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    print_verification(result)
