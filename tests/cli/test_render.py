"""The plan as a person reads it: the answer first, then one table as wide as the terminal with
nothing cut, mesh candidates named by their mesh, and the breakdown behind --verbose. The figures are
tested where they are computed; here, that the text shows the plan's figures (its JSON) in place."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from advisor.cli.main import cli
from advisor.cli.plan_view import memory_table, plan_table, plan_title, timing_cells
from advisor.estimate.step_time import StepTime
from advisor.planning.api import plan
from advisor.units import GIB

STRATEGY_ROWS = ("dp", "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")
QWEN = ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100"]
MESH = ["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--seq-len", "131072"]
# The mesh candidates of MESH (tests/planning/test_meshes.py): zero3 on every mesh of 8 GPUs whose tp
# divides the 8 KV heads, within one node.
MESH_NAMES = ("zero3 dp_shard 4 x cp 2", "zero3 dp_shard 2 x cp 4", "zero3 cp 8", "zero3 dp_shard 4 x tp 2",
              "zero3 dp_shard 2 x cp 2 x tp 2", "zero3 cp 4 x tp 2", "zero3 dp_shard 2 x tp 4", "zero3 cp 2 x tp 4")


def _text(table, width: int = 200) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def _run(args: list[str], columns: int) -> tuple[str, dict]:
    """The text at COLUMNS=columns, and the same plan's JSON."""
    result = CliRunner().invoke(cli, args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    return result.stdout, doc


def test_title_names_the_cluster_and_units():
    p = plan("Qwen/Qwen2.5-7B", "2xA100")
    assert plan_title(p) == ("Qwen/Qwen2.5-7B on 2 x A100-80GB-SXM (79.15 GiB each): bf16-mixed, adamw, seq 2048, "
                             "torch engine")


def test_offload_is_not_counted_as_communication():
    """1 s step: 0.1 s exposed collectives, 0.5 s exposed PCIe + CPU optimizer -> 10% and 50%."""
    step = StepTime(compute_s=0.4, communication_s=0.3, exposed_communication_s=0.1, offload_s=0.6,
                    exposed_offload_s=0.5, optimizer_s=0.0, step_s=1.0, micro_batch_size=1,
                    gradient_accumulation_steps=1, world_size=2, tokens_per_gpu=2048, tokens_per_s=4096.0,
                    model_flops_per_gpu=1.0, hardware_flops_per_gpu=1.0, peak_tflops=1.0, utilisation=0.5, mfu=0.5)
    assert timing_cells(step) == ("1.00", "4,096", "50%", "10%", "50%")


def test_plan_tables_headers_and_rows():
    p = plan("Qwen/Qwen2.5-7B", "2xA100")
    main, memory = _text(plan_table(p)), _text(memory_table(p))
    for header in ("peak GiB", "% of GPU", "CPU GiB/node", "step s", "tok/s", "comm %", "offload %"):
        assert header in main
    for header in ("rest params", "rest grads", "rest optim", "rest on", "peak moment", "activ", "alloc gap", "context"):
        assert header in memory
    # The two parts of the runtime overhead, each with where it comes from.
    assert "--context-gib" in memory and "profiles/allocator_overhead.json" in memory
    assert "model states at rest" in memory and "peak moment" in memory
    for name in STRATEGY_ROWS:
        assert name in main and name in memory


@pytest.mark.parametrize("columns", [80, 200])
def test_the_answer_is_in_the_first_three_lines(columns):
    out, doc = _run(QWEN, columns)
    rec = doc["recommendation"]
    chosen = next(c for c in doc["candidates"] if c["strategy"] == rec["strategy"] and c["mesh"] is None)
    head = " ".join(out.splitlines()[:3])
    step = chosen["step_time"]
    for figure in (f"Recommendation: {rec['strategy']} (torch), micro-batch {rec['micro_batch_size']}",
                   f"{chosen['memory_bytes']['total'] / GIB:.2f} of {doc['hardware']['gpu_memory_bytes'] / GIB:.2f} GiB",
                   f"{step['step_s']:.2f} s/step", f"{step['tokens_per_s']:,.0f} tokens/s", "Why:"):
        assert figure in head, (figure, head)
    # zero3_offload: zero3 no longer fits 2 A100s with the CUDA context; of the two offload variants, checkpointed
    # at the largest micro-batch within the headroom, zero3_offload is faster (tests/planning/test_plan_cases.py).
    assert rec["strategy"] == "zero3_offload"


@pytest.mark.parametrize("args", [QWEN, MESH, [*QWEN, "--seq-len", "max"], [*QWEN, "--verbose"]],
                         ids=["qwen", "mesh", "seq-max", "verbose"])
def test_nothing_is_wider_than_the_terminal_or_cut_at_80_columns(args):
    out, _ = _run(args, 80)
    assert "\u2026" not in out  # rich's ellipsis: a cell cut to fit
    if "--verbose" not in args:  # the breakdown table is printed whole, wider than the terminal if need be
        assert max(len(line) for line in out.splitlines()) <= 80, out


def test_a_wide_terminal_shows_every_column_and_the_range():
    out, doc = _run(QWEN, 200)
    assert max(len(line) for line in out.splitlines()) <= 200 and "\u2026" not in out
    for header in ("peak GiB", "% of GPU", "mbs", "ckpt", "CPU GiB/node", "step s", "tok/s", "MFU", "comm %", "offload %"):
        assert header in out
    low = doc["candidates"][-1]["memory_range"]["low"]
    assert f"({low / GIB:.1f}-" in out and "Not shown" not in out
    narrow, _ = _run(QWEN, 80)
    assert "Not shown at 80 columns: range" in narrow and "MFU" in narrow.split("Not shown")[1]


def test_the_breakdown_bars_reasons_and_assumptions_are_behind_verbose():
    out, doc = _run(QWEN, 120)
    assert "Where the memory goes" not in out and "Assumptions:" not in out
    assert f"--verbose: memory per component, bars, {len(doc['why'])} reasons, {len(doc['assumptions'])} assumptions" in out
    verbose, _ = _run([*QWEN, "--verbose"], 120)
    assert "Where the memory goes" in verbose and "Assumptions:" in verbose and "margin policy" in verbose
    words = " ".join(verbose.split())  # a long reason wraps under its bullet
    assert all(" ".join(line.split()) in words for line in doc["why"][:1]) and "% of 79.15 GiB" in verbose


def test_mesh_candidates_are_named_by_their_mesh_in_the_table_and_the_bars():
    wide, _ = _run(MESH, 200)
    for name in MESH_NAMES:
        assert re.search(rf"^{re.escape(name)}( \*)?\s", wide, re.M), name
    assert "zero3 cp 8 *" in wide and "Recommendation: zero3 (torch) on mesh cp 8" in wide
    narrow, _ = _run(MESH, 80)
    assert "zero3 cp8 *" in narrow and "zero3 dp2 cp2 tp2 " in narrow and "mesh names: dp" in narrow
    verbose, _ = _run([*MESH, "--verbose"], 200)
    bars = [line for line in verbose.splitlines() if line.endswith("% of 79.18 GiB")]
    assert [line.split(" ", 1)[0] for line in bars if not line.startswith(" ")] == ["zero3"]  # the longest name
    starts = {re.match(r"^ *(.+?) [#.|]", line).end() for line in bars}
    assert len(bars) == len(STRATEGY_ROWS) + len(MESH_NAMES) and len(starts) == 1  # bars start in one column
    for name in MESH_NAMES:
        assert any(line.lstrip().startswith(name + " ") for line in bars), name


def test_headroom_option_reaches_the_plan():
    out = CliRunner().invoke(cli, ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--headroom", "0.3", "--json"])
    doc = json.loads(out.output)
    assert doc["training"]["headroom"] == 0.3
    assert any("at most 70% of memory (30% headroom, --headroom)" in a for a in doc["assumptions"])
    assert CliRunner().invoke(cli, ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--headroom", "1"]).exit_code == 2


@pytest.mark.parametrize("model, gpus, kwargs", [
    ("Qwen/Qwen2.5-7B", "2xA100", {}),  # offload columns, a remedy
    ("meta-llama/Llama-3.1-8B", "8xH100", {"seq_len": 131072}),  # mesh names, long and short
    ("Qwen/Qwen2.5-7B", "8xH100", {"seq_len": "max"}),  # the max seq column
    ("meta-llama/Llama-3.1-70B", "1xA100", {}),  # nothing fits
])
def test_natural_width_is_richs_measurement(model, gpus, kwargs):
    """The narrowing loop's table width, summed from cached cell widths, is what rich measures for the whole
    table, at every narrowing step, and for --verbose's breakdown (rich pads and rules the columns itself)."""
    from rich.measure import Measurement

    from advisor.cli import plan_view

    p = plan(model, gpus, **kwargs)
    console = Console(width=80, emoji=False)
    layout, widths = plan_view._Layout(), {}
    for step in (None, *plan_view._NARROWING):
        if step is not None:
            layout = plan_view._narrower(layout, step)
        table = plan_view._table(p, layout)
        whole = Measurement.get(console, console.options.update_width(10_000), table).maximum
        assert plan_view._natural_width(console, table, widths) == whole
    breakdown = memory_table(p)  # --verbose: the same box, no edge
    assert plan_view._natural_width(console, breakdown, {}) == Measurement.get(
        console, console.options.update_width(10_000), breakdown).maximum


def test_nothing_fits_names_the_best_remedy_beside_the_count_hint():
    """A LoRA of Llama 3.1 8B at 65,536 tokens on 8 x H100: no count of GPUs holds it as asked ("shorten --seq-len"),
    but a loss kernel does; the answer says so on its own line, the planner's first ranked remedy that fits, in the
    figures its JSON why line carries."""
    args = ["plan", "-m", "meta-llama/Llama-3.1-8B", "-g", "8xH100", "--seq-len", "65536", "--lora", "16"]
    runner = CliRunner()
    out = runner.invoke(cli, args, env={"COLUMNS": "200"}).output
    doc = json.loads(runner.invoke(cli, [*args, "--json"]).output)
    assert doc["recommendation"] is None
    line = next(w for w in doc["why"] if w.startswith("with --loss "))
    assert f"Instead: {line}" in out and out.index("Why:") < out.index("Instead:")


def test_an_offloading_answer_says_the_host_ram_it_holds():
    """The CPU RAM a node holds for the offloaded states is part of whether the plan runs: the why line says it (the
    table drops its column first when the terminal is narrow), where the answer line already gives the tokens/s."""
    out, doc = _run(QWEN, 80)
    rec = doc["recommendation"]
    chosen = next(c for c in doc["candidates"] if c["strategy"] == rec["strategy"] and c["mesh"] is None)
    assert rec["strategy"].endswith("_offload") and chosen["cpu_memory_bytes"] > 0
    why = " ".join(out.split("Why:")[1].split("\n\n")[0].split())
    assert why.startswith(f"{rec['strategy']} offloads to the CPU ({chosen['cpu_memory_bytes'] / GIB:.1f} GiB of RAM "
                          "per node); with --optimizer-impl fused"), why
    assert doc["why"][0].startswith(f"{rec['strategy']} offloads to the CPU ("
                                    f"{chosen['step_time']['tokens_per_s']:,.0f} tokens/s)")  # --json: unchanged


def test_seq_len_max_that_fills_the_gpu_gives_the_longest_within_the_headroom_as_its_why():
    """--seq-len max answers with a length that fills the GPU (100%); the one line of why gives the longest the same
    plan holds within the --headroom, the figure the JSON's longest-within-headroom reason carries (worked and tested
    against the estimate in tests/planning/test_longest.py). Qwen2.5-7B's longest on one H100 is inside its 32,768
    context, so no context caveat comes first."""
    out, doc = _run(["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "1xH100", "--lora", "16", "--seq-len", "max"], 200)
    (roomy,) = [x for x in doc["reasons"] if x["kind"] == "longest-within-headroom"]
    assert roomy["longest_seq_len"] == doc["training"]["seq_len"] < 32_768
    (longer,) = [x for x in doc["reasons"] if x["kind"] == "longer-with-change"]  # then the fused loss's longest
    why = next(line for line in out.splitlines() if line.startswith("Why:"))
    assert why.startswith(f"Why: ddp holds {roomy['longest_seq_len']:,} tokens only past the 10% headroom (the longest "
                          f"fills the GPU); within it, {roomy['seq_len']:,} (--seq-len {roomy['seq_len']}). With "
                          f"--loss fused (keeps the mathematics), ddp holds {longer['seq_len']:,} tokens")
