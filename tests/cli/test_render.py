"""The plan as a person reads it: a title with units, offload apart from collectives, two labelled
memory views. Headers and row names only; the figures are tested where they are computed."""

from __future__ import annotations

from click.testing import CliRunner
from rich.console import Console

from advisor.cli.main import cli
from advisor.cli.render import _timing_cells, memory_table, plan_table, plan_title
from advisor.estimate.step_time import StepTime
from advisor.planning.api import plan

STRATEGY_ROWS = ("dp", "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")


def _text(table) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(table)
    return console.export_text()


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
    assert _timing_cells(step) == ("1.00", "4,096", "50%", "10%", "50%")


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


def test_cli_prints_both_views():
    out = CliRunner().invoke(cli, ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100"]).output
    assert "Per-GPU peak memory and step time" in out and "Where the memory goes" in out
    # zero2_offload: zero3 no longer fits 2 A100s with the CUDA context; both offload variants run micro-batch 3
    # within the headroom, and the first along the escalation stands (tests/planning/test_plan_cases.py).
    assert "Recommendation: zero2_offload" in out and "margin policy" in out


def test_headroom_option_reaches_the_plan():
    out = CliRunner().invoke(cli, ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--headroom", "0.3", "--json"])
    import json

    doc = json.loads(out.output)
    assert doc["training"]["headroom"] == 0.3
    assert any("at most 70% of memory (30% headroom, --headroom)" in a for a in doc["assumptions"])
    assert CliRunner().invoke(cli, ["plan", "-m", "Qwen/Qwen2.5-7B", "-g", "2xA100", "--headroom", "1"]).exit_code == 2
