"""The README's examples run as written: every ``advisor ...`` command line in its code blocks goes
through the CLI, every Python block is executed, and every inline ``advisor.xxx(...)`` call is
evaluated. Commands run in a scratch directory (exports write files there). The Python blocks use
names the README leaves to the reader (``model``, ``optimizer``, ``loader``): the test supplies a
tiny Llama, AdamW and a loader of token batches, and nothing else.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The README and the documentation site's pages: every example in either runs as written.
PAGES = {"README.md": README, **{f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}}
TEXT = "\n".join(PAGES.values())
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE_CALL = re.compile(r"`(advisor\.\w+\([^`]*\))`")
PLAN_OUTPUT = re.compile(r"<!-- plan-output: (advisor [^>]*?) -->\n```text\n(.*?)^```", re.S | re.M)


def _blocks(language: str | None = None) -> list[str]:
    return [body for lang, body in BLOCK.findall(TEXT) if language is None or lang == language]


def _command_lines() -> list[str]:
    lines = []
    for body in _blocks():
        for line in body.splitlines():
            for part in line.split("&&"):  # "pip install . && advisor plan ...": the advisor part
                part = part.strip()
                if part.startswith("advisor "):
                    lines.append(part)
    return lines


def _expected_exit(line: str) -> int:
    """What the line does on a machine with no NVIDIA GPU (CI's, and the one the test pretends to be): a
    launch that is not a dry run needs the GPUs it names, so it must refuse (exit 2) instead of running
    something else."""
    args = shlex.split(line, comments=True)
    return 2 if args[1] == "launch" and "--dry-run" not in args else 0


def test_the_readme_has_examples():
    assert len(_command_lines()) >= 10 and _blocks("python")


# What a simulated step of a 7B model costs CI (minutes on 2 cores) proves nothing the same command on
# the model's shape at toy width does not: the lines that run the step (simulate, --verify) get the
# named model's own config with these sizes, through a local config directory.
TINY_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1024, max_position_embeddings=4096)


def _on_a_tiny_config(args: list[str], directory: Path) -> list[str]:
    """``args`` with the model of a simulating line replaced by a tiny config of its own family."""
    if args[1] != "simulate" and "--verify" not in args:
        return args
    from advisor.model.bundled import find_bundled_model, load_bundled_config

    at = next(i for i, arg in enumerate(args) if arg in ("--model", "-m")) + 1
    config = {**load_bundled_config(find_bundled_model(args[at])), **TINY_SIZES}
    config.pop("head_dim", None)
    (directory / "config.json").write_text(json.dumps(config))
    return [*args[:at], str(directory), *args[at + 1:]]


@pytest.mark.parametrize("line", _command_lines())
def test_command_runs_as_written(line, tmp_path, monkeypatch, capsys):
    """Through the console entry point, so bad input is the one-line exit 2 a user sees."""
    import advisor.export.launch
    from advisor.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(advisor.export.launch, "local_gpus", lambda: None)
    (tmp_path / "train.py").write_text("print('trained')\n")
    for example in (ROOT / "docs" / "examples").glob("*"):  # the configs the docs' `--from` lines read
        (tmp_path / example.name).write_text(example.read_text())
    (tmp_path / "tiny").mkdir()
    with pytest.raises(SystemExit) as exited:
        main(_on_a_tiny_config(shlex.split(line, comments=True), tmp_path / "tiny")[1:])
        raise SystemExit(0)
    out = capsys.readouterr()
    assert exited.value.code == _expected_exit(line), out.out + out.err
    if _expected_exit(line):
        assert len(out.err.strip().splitlines()) == 1 and "trained" not in out.out, out.err


@pytest.mark.parametrize("call", INLINE_CALL.findall(TEXT))
def test_inline_call_runs(call, tiny_training):
    import advisor

    assert eval(call, {"advisor": advisor, **tiny_training}) is not None


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_block_runs(index, tiny_training, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_blocks("python")[index], f"README/docs python block {index}", "exec"), dict(tiny_training))


def test_the_readme_quotes_the_plan_as_printed(monkeypatch, capsys):
    """The README's plan output is what the command prints at COLUMNS=100 (trailing spaces aside): a
    change of recommendation, figure or layout fails here until the README is updated."""
    from advisor.cli.main import main

    [(line, quoted)] = PLAN_OUTPUT.findall(README)
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exited:
        main(shlex.split(line, comments=True)[1:])
        raise SystemExit(0)
    printed = [row.rstrip() for row in capsys.readouterr().out.rstrip("\n").splitlines()]
    assert exited.value.code == 0
    assert printed == quoted.rstrip("\n").splitlines()


def test_the_readme_stays_short_and_links_its_docs():
    assert len(README.splitlines()) <= 200
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", README))
    assert linked == {name for name in PAGES if name.startswith("docs/")} - {"docs/index.md"}


@pytest.fixture
def tiny_training():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=128)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.randint(0, 128, (8, 16))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(batches), batch_size=4)
    return {"model": model, "optimizer": optimizer, "loader": loader}


def test_the_readme_accuracy_rows_are_the_reports_figures():
    """The README's real-GPU rows quote the reports' summaries (which the benchmarks write): a figure
    changed in one place and not the other fails here."""
    readme = (ROOT / "README.md").read_text()
    truth = (ROOT / "benchmarks/results/gpu_truth.md").read_text()
    stacks = (ROOT / "benchmarks/results/gpu_stacks.md").read_text()
    med, top = re.search(r"analytic vs GPU \(second step\): median \|error\| ([0-9.]+)%, max ([0-9.]+)%", truth).groups()
    assert f"| allocated vs a real H100 (`max_memory_allocated`) | 30 | {med}% | {top}% |" in readme
    found = re.search(r"reserved \(Trainer, Lightning and wrap\(\) rows\): median \|err\| ([0-9.]+)%, max ([0-9.]+)% over (\d+); "
                      r"the one-GPU stacks alone \(Trainer, Lightning and wrap\(\) rows\): allocated median \|err\| ([0-9.]+)%, "
                      r"max ([0-9.]+)% over (\d+)", stacks)
    r_med, r_max, n, a_med, a_max, n2 = found.groups()
    assert f"on one H100: allocated | {n2} | {a_med}% | {a_max}% |" in readme
    assert (f"| the same runs: reserved (`max_memory_reserved`; 3 of them among the 13 runs the checkpointing term "
            f"of the allocator gap is fit on) | {n} | {r_med}% | {r_max}% |") in readme
    f_med, f_max, f_n, fr_med, fr_max = re.search(
        r"run from an empty cache \(torchtitan units, --activation-offload\): allocated median \|err\| ([0-9.]+)%, max "
        r"([0-9.]+)% over (\d+), reserved median \|err\| ([0-9.]+)%, max ([0-9.]+)%", stacks).groups()
    assert (f"(rank 0 of a fake group): allocated; reserved | {f_n} | {f_med}% | {f_max}%; reserved median {fr_med}%, "
            f"max {fr_max}% |") in readme
    b_med, b_max, b_n, br_med, br_max, bs_med, bs_max = re.search(
        r"## BERT-large[^\n]*\n[\s\S]*?- allocated: median \|err\| ([0-9.]+)%, max ([0-9.]+)% over (\d+); reserved median "
        r"([0-9.]+)%, max ([0-9.]+)%; nvidia-smi median ([0-9.]+)%, max ([0-9.]+)%", stacks).groups()
    assert (f"allocated; reserved; nvidia-smi | {b_n} | {b_med}% | {b_max}%; reserved median {br_med}%, max {br_max}% "
            f"(the gap fit on decoder LLMs is too wide here); nvidia-smi median {bs_med}%, max {bs_max}% |") in readme
    compiled = (ROOT / "benchmarks/results/gpu_compile.md").read_text()
    c_med, c_max, c_n = re.search(r"compiled blocks, the loss eager \(the torch recipe as planned\): median \|err\| "
                                  r"([0-9.]+)%, max ([0-9.]+)% over (\d+) runs", compiled).groups()
    assert f"vs a real H100: allocated | {c_n} | {c_med}% | {c_max}% |" in readme
    scale = (ROOT / "benchmarks/results/gpu_scale.md").read_text()
    rows = {setting: (allocated, reserved) for setting, allocated, reserved in re.findall(
        r"\| (defaults|expandable_segments:True) \| [0-9.]+ \| [0-9.]+ \| ([-+0-9.]+%) \| [0-9.]+ \| [0-9.]+ \| "
        r"([-+0-9.]+%) \|", scale)}
    (allocated, reserved), expandable = rows["defaults"], rows["expandable_segments:True"][1]
    assert (f"(with expandable segments) | 1 | {allocated} | reserved {reserved} ({expandable}) "
            "| `benchmarks/results/gpu_scale.md` |") in readme
    speed = (ROOT / "benchmarks/results/gpu_speed.md").read_text()
    s_med, s_low, s_high, s_n = re.search(r"median \|error\| ([0-9.]+)%, signed ([-+0-9.]+)% to ([-+0-9.]+)% over (\d+) runs",
                                          speed).groups()
    worst = max(abs(float(s_low)), abs(float(s_high)))
    assert f"(one GPU, no communication; held out) | {s_n} | {s_med}% | {worst:.1f}% |" in readme
    published = (ROOT / "benchmarks/results/published_memory.md").read_text()
    p_med, p_max, p_n = re.search(r"vs published nvidia-smi: median \|error\| ([0-9.]+)%, max ([0-9.]+)% over (\d+) cases",
                                  published).groups()
    assert f"| total (reserved + CUDA context) vs published nvidia-smi figures | {p_n} | {p_med}% | {p_max}% |" in readme


def test_the_readme_longest_row_is_the_longest_context_summary():
    """The README's longest-sequence row quotes benchmarks/results/longest_context.md's summary line."""
    readme = (ROOT / "README.md").read_text()
    report = (ROOT / "benchmarks/results/longest_context.md").read_text()
    n, med, top, judged, never = re.search(
        r"\*\*longest: (\d+) cases, ours / published - 1: median \|error\| ([0-9.]+)%, max ([0-9.]+)%; setups that fit no "
        r"length: judged not to fit (\d+) of (\d+)\*\*", report).groups()
    assert f"setups that fit no length | {n} | {med}% | {top}%; {judged} of {never} judged not to fit |" in readme


def test_the_readme_panel_row_is_the_published_jobs_summary():
    """The README's published-jobs row quotes benchmarks/results/published_jobs.md's summary line
    (``benchmarks/published_jobs.py`` writes it)."""
    readme = (ROOT / "README.md").read_text()
    report = (ROOT / "benchmarks/results/published_jobs.md").read_text()
    n, fit, fit_n, agree, agree_n, fast, fast_n, low, med, top = re.search(
        r"\*\*(\d+) jobs \(0 skipped\); judged to fit: (\d+)/(\d+); offload agreement: (\d+)/(\d+); speed not slower: "
        r"(\d+)/(\d+) \(ratio ours/published min ([0-9.]+), median ([0-9.]+), max ([0-9.]+)", report).groups()
    assert n == fit_n == agree_n
    assert (f"| {n} | {fit} fit, {agree} agree on offload | {fast} of {fast_n} not slower (ours / published: min {low}, "
            f"median {med}, max {top}) |") in readme


def test_the_readme_zero_bubble_row_is_the_reports():
    """The zero-bubble row quotes accuracy_pipeline.md's Table 4 summary lines (total, then peak allocated)."""
    readme = (ROOT / "README.md").read_text()
    report = (ROOT / "benchmarks/results/accuracy_pipeline.md").read_text()
    line = r"{} against the paper: median ([-+0-9.]+)%, max ([-+0-9.]+)% over (\d+)\."
    med, top, n = re.search(line.format(r"Total \(peak allocated \+ allocator gap \+ context\)"), report).groups()
    a_med, a_top, _ = re.search(line.format("Peak allocated"), report).groups()
    assert (f"| worst stage's peak allocated vs the zero-bubble paper's Table 4 (GPT-3-like models as GPT-2 with F.gelu; "
            f"the paper does not say which figure it printed, its 1F1B rows read as allocated) | {n} | {a_med}% | "
            f"{a_top}% |") in readme
    assert (f"| the same runs, our total (allocated + allocator gap + CUDA context) vs the paper's figure | {n} | {med}% | "
            f"{top}% |") in readme


def test_the_docs_published_memory_summary_is_the_reports():
    """docs/accuracy.md's summary of the published real-GPU set quotes benchmarks/results/published_memory.md
    (which ``benchmarks/published_memory.py`` writes): the errors, the fit verdicts and the range's count."""
    docs = " ".join(line.lstrip("> ") for line in (ROOT / "docs/accuracy.md").read_text().splitlines())
    report = (ROOT / "benchmarks/results/published_memory.md").read_text()

    def figures(pattern: str) -> tuple[str, ...]:
        found = re.search(pattern, report)
        assert found, pattern
        return found.groups()

    r_med, r_max, r_n = figures(r"`reserved` vs published reserved: median \|error\| ([0-9.]+)%, max ([0-9.]+)% over (\d+)")
    a_med, a_max, a_n = figures(r"peak allocated vs published allocated \(or active\): median \|error\| ([0-9.]+)%, "
                                r"max ([0-9.]+)% over (\d+)")
    low, high = figures(r"llamafactory QLoRA, unspecified: .*?signed ([-+0-9.]+)% to ([-+0-9.]+)%")
    smi_low, smi_high = figures(r"peft LoRA, nvidia-smi: .*?signed ([-+0-9.]+)% to ([-+0-9.]+)%")
    trained, trained_n, oom, oom_n = figures(r"- all: every case: .*?trained runs judged to fit (\d+) of (\d+); "
                                             r"OOM runs judged not to fit (\d+) of (\d+)")
    inside, published = figures(r"figures inside the plan's low-high range .*?: (\d+) of (\d+)")
    assert f"median {r_med}%, max {r_max}% over {r_n} cases" in docs
    assert f"median {a_med}%, max {a_max}% over {a_n} cases" in docs
    assert f"{low}% to {high}%" in docs and f"{smi_low}% (DeepSpeed ZeRO-3) and {smi_high}% (FSDP" in docs
    assert f"all {trained} runs that trained" in docs and trained == trained_n
    assert f"{oom} of the {oom_n} OOMs are judged not to fit" in docs
    assert f"{inside} of the {published} published reserved" in docs


def test_the_readme_sweep_row_is_the_sweep_summary():
    """The README's sweep row quotes benchmarks/results/sweep_summary.md (benchmarks/sweep.py writes it)."""
    summary = (ROOT / "benchmarks/results/sweep_summary.md").read_text()
    n, med, p90, top = re.search(r"(\d+) measured cases .*?median ([0-9.]+)%, p90 ([0-9.]+)%, max ([0-9.]+)%",
                                 summary).groups()
    outside, outside_top = re.search(r"cases no known gap covers: median [0-9.]+%, p90 ([0-9.]+)%, max ([0-9.]+)%",
                                     summary).groups()
    assert (f"| {n} | {med}% | {top}% (p90 {p90}%; outside the known gaps p90 {outside}%, max {outside_top}%) |"
            in README)
