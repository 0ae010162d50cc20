"""``advisor simulate --timeline`` and ``advisor plan --chart``: the files parse as SVG, draw what the
simulator measured and what the estimate says, fetch nothing, and never clobber a file."""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET
from collections import defaultdict

import pytest

from advisor.simulate.timeline import CATEGORIES
from tests.cli._main import run_main
from tests.conftest import TINY_CONFIGS

NS = {"svg": "http://www.w3.org/2000/svg"}
TINY = dict(TINY_CONFIGS["llama_tied_bias"], _name_or_path="tiny-llama-2-layers")  # 2 blocks
SIMULATE = ["simulate", "--gpus", "2xA100", "--strategy", "zero3", "--micro-batch", "2", "--seq-len", "64"]


@pytest.fixture(scope="module")
def timeline_run(tmp_path_factory):
    """One simulated step of a 2-block model, with its JSON and its chart."""
    folder = tmp_path_factory.mktemp("timeline")
    (folder / "config.json").write_text(json.dumps(TINY))
    chart = folder / "step.svg"
    from click.testing import CliRunner

    from advisor.cli.main import cli

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CliRunner().invoke(cli, [*SIMULATE, "--model", str(folder), "--json", "--timeline", str(chart)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    return doc, chart.read_text(), folder


def _svg(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def test_timeline_is_svg_with_a_group_per_category_and_every_block_labelled(timeline_run):
    _, text, _ = timeline_run
    root = _svg(text)
    groups = root.findall(".//svg:g[@class='category']", NS)
    assert [g.get("data-category") for g in groups] == list(CATEGORIES)
    labels = {(t.get("data-phase"), t.get("data-block")) for t in root.findall(".//svg:text[@class='block-label']", NS)}
    assert labels == {("forward", "0"), ("forward", "1"), ("backward", "0"), ("backward", "1")}
    phases = [t.text for t in root.findall(".//svg:text[@class='phase-label']", NS)]
    assert phases == ["forward", "loss", "backward", "optimizer step"]


def test_plotted_peak_is_the_simulated_peak(timeline_run):
    doc, text, _ = timeline_run
    root = _svg(text)
    stacks: dict[str, int] = defaultdict(int)
    tops: dict[str, float] = defaultdict(lambda: float("inf"))
    for rect in root.findall(".//svg:g[@class='category']/svg:rect", NS):
        stacks[rect.get("data-segment")] += int(rect.get("data-bytes"))
        tops[rect.get("data-segment")] = min(tops[rect.get("data-segment")], float(rect.get("y")))
    tallest = max(stacks, key=stacks.get)
    assert stacks[tallest] == doc["simulated"]["peak_allocated"]  # what the tracker measured
    marker = root.find(".//svg:circle[@class='peak']", NS)
    assert int(marker.get("data-bytes")) == doc["simulated"]["peak_allocated"]
    assert abs(float(marker.get("cy")) - tops[tallest]) < 0.1  # drawn where the tallest column ends


def test_moment_markers_are_the_analytic_moments(timeline_run):
    doc, text, _ = timeline_run
    root = _svg(text)
    lines = {line.get("data-moment"): line for line in root.findall(".//svg:line[@class='moment']", NS)}
    moments = {name: doc["analytic"][f"at_{name}"] for name in ("start_of_forward", "end_of_forward", "loss_backward",
                                                                 "block_backward", "end_of_backward", "optimizer_step")
               if doc["analytic"][f"at_{name}"] is not None}
    assert {name: int(line.get("data-bytes")) for name, line in lines.items()} == moments
    # The largest moment is the estimate's peak; a higher figure is drawn higher.
    assert max(moments.values()) == doc["analytic"]["peak_allocated"]
    ordered = sorted(lines.values(), key=lambda line: int(line.get("data-bytes")))
    assert [float(line.get("y1")) for line in ordered] == sorted((float(line.get("y1")) for line in ordered),
                                                                  reverse=True)


def test_charts_fetch_nothing(timeline_run, tmp_path, capsys):
    _, text, _ = timeline_run
    code, _, _ = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--chart",
                           str(tmp_path / "plan.html")], capsys)
    assert code == 0
    page = (tmp_path / "plan.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    for content in (text, page):
        assert content.count("http") == 1 and 'xmlns="http://www.w3.org/2000/svg"' in content
        assert "<script" not in content and "href" not in content


def test_plan_chart_has_a_bar_per_strategy_and_the_gpu_capacity(tmp_path, capsys):
    chart = tmp_path / "plan.svg"
    code, out, _ = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--micro-batch", "2",
                             "--json", "--chart", str(chart)], capsys)
    assert code == 0
    doc = json.loads(out)
    root = _svg(chart.read_text())
    bars = {g.get("data-strategy"): g for g in root.findall(".//svg:g[@class='bar']", NS)}
    expected = {c["strategy"]: c["memory_bytes"] for c in doc["candidates"] if c["memory_bytes"] is not None}
    assert set(bars) == set(expected)
    for strategy, bar in bars.items():
        parts = {r.get("data-part"): int(r.get("data-bytes")) for r in bar.findall("svg:rect", NS)}
        # The runtime overhead in two segments: the allocator gap (reserved - allocated, less FSDP's cached
        # gradient blocks and the blocks cached around recomputation, which the bar of what must fit leaves out)
        # and the context.
        m = expected[strategy]
        assert parts == {**{k: expected[strategy][k] for k in CATEGORIES},
                         "allocator_gap": m["reserved"] - m["peak_allocated"] - m.get("gradient_stream_pool", 0)
                         - m.get("recompute_cache", 0),
                         "outside_allocator": expected[strategy]["outside_allocator"]}
        assert int(bar.get("data-total-bytes")) == expected[strategy]["total"]
    capacity = root.find(".//svg:line[@class='capacity']", NS)
    assert int(capacity.get("data-bytes")) == doc["hardware"]["gpu_memory_bytes"]


def test_an_existing_chart_needs_force_and_is_refused_before_the_simulation(tmp_path, capsys):
    chart = tmp_path / "step.svg"
    chart.write_text("mine")
    code, _, err = run_main([*SIMULATE, "--model", "Qwen/Qwen2.5-7B", "--timeline", str(chart)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--force" in err
    assert chart.read_text() == "mine"
    code, _, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--chart", str(chart)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--force" in err
    code, _, _ = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--chart", str(chart),
                           "--force"], capsys)
    assert code == 0 and chart.read_text().startswith("<svg")


@pytest.mark.parametrize("command", [[*SIMULATE, "--model", "Qwen/Qwen2.5-7B", "--timeline"],
                                     ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--chart"]])
def test_a_bad_path_is_one_line_and_exit_2(command, tmp_path, capsys):
    for bad in (tmp_path / "missing" / "chart.svg", tmp_path):
        code, out, err = run_main([*command, str(bad)], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("command", [[*SIMULATE, "--model", "Qwen/Qwen2.5-7B", "--timeline"],
                                     ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--chart"]])
def test_a_chart_named_png_is_refused_not_written_as_svg(command, tmp_path, capsys):
    """The charts are SVG: a .png name once got SVG content under it."""
    chart = tmp_path / "chart.png"
    code, out, err = run_main([*command, str(chart)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and ".svg or .html" in err and "chart.png" in err, err
    assert out == "" and not chart.exists()


def test_many_blocks_get_group_labels_not_one_label_each():
    """A 32-block step (made by hand): every 4th block is numbered, and each run of blocks is bracketed."""
    from advisor.cli.charts import timeline_svg
    from advisor.simulate.timeline import CategoryBytes, Segment, Timeline

    def seg(phase, label, block=None):
        return Segment(phase=phase, label=label, block=block, peak=CategoryBytes(activations=2**30),
                       end=CategoryBytes(activations=2**29))

    segments = ([seg("forward", "embed_tokens")] + [seg("forward", f"block {i}", i) for i in range(32)]
                + [seg("loss", "loss"), seg("loss", "loss backward")]
                + [seg("backward", f"block {i}", i) for i in reversed(range(32))] + [seg("optimizer_step", "optimizer step")])
    root = _svg(timeline_svg(Timeline(segments=tuple(segments), num_blocks=32), title="t", moments=None))
    numbered = [t for t in root.findall(".//svg:text[@class='block-label']", NS)]
    assert sorted({int(t.get("data-block")) for t in numbered}) == list(range(0, 32, 4))
    groups = [t.text for t in root.findall(".//svg:text[@class='group-label']", NS)]
    assert groups == ["blocks 0 \u2192 31", "blocks 31 \u2192 0"]
    assert root.findall(".//svg:line[@class='moment']", NS) == []


def test_plan_chart_names_each_mesh_and_keeps_labels_apart(tmp_path, capsys):
    """8B at 131072 tokens on 8 H100s: 7 strategies and 8 meshes (tests/cli/test_render.py's MESH_NAMES); each
    bar is named by its mesh (was: all eight 'zero3'), one row each, and the legend names the recommended mesh."""
    from tests.cli.test_render import MESH_NAMES, STRATEGY_ROWS

    chart = tmp_path / "mesh.svg"
    code, _, _ = run_main(["plan", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100", "--seq-len", "131072",
                           "--chart", str(chart)], capsys)
    assert code == 0
    root = _svg(chart.read_text())
    labels = [t.text for t in root.findall(".//svg:text[@class='bar-label']", NS)]
    assert [label.removesuffix(" *") for label in labels] == [*STRATEGY_ROWS, *MESH_NAMES]
    assert "zero3 cp 8 *" in labels  # the recommendation, marked
    bars = root.findall(".//svg:g[@class='bar']", NS)
    assert [b.get("data-label") for b in bars] == [*STRATEGY_ROWS, *MESH_NAMES]
    assert {b.get("data-mesh") for b in bars if b.get("data-mesh")} == {n.removeprefix("zero3 ") for n in MESH_NAMES}
    ys = sorted(float(t.get("y")) for t in root.findall(".//svg:text[@class='bar-label']", NS))
    assert min(b - a for a, b in zip(ys, ys[1:])) >= 24  # one row each: no two names share a line
    assert root.find(".//svg:text[@class='recommended']", NS).get("data-label") == "zero3 cp 8"
    assert "".join(root.find(".//svg:text[@class='recommended']", NS).itertext()) == "zero3 cp 8"


def test_a_chart_path_ending_in_a_separator_is_named_a_folder(tmp_path, capsys):
    """'d.svg/' was refused as 'not d.svg', though d.svg is an SVG name (a review's finding)."""
    code, out, err = run_main(["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4xA100", "--chart",
                               f"{tmp_path}/d.svg/"], capsys)
    assert code == 2 and out == "" and "ends in a path separator, a folder" in err and len(err.strip().splitlines()) == 1
