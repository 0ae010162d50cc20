"""Planning speed for a family with no activation formula: `advisor plan` on a 1.3B OPT config
(facebook/opt-1.3b's shape: width 2048, 24 layers, FFN 8192, vocabulary 50272), cold (empty cache:
meta-device counts + traced profiles) and cached (both read from the cache directory), each in a fresh
process, next to a bundled Llama-family model planned the same way (the torch-free fast path).

Run: python benchmarks/trace_speed.py [--repeat 3] [--split] [--rope]

``--rope``: instead, a config with ``rope_scaling`` (allenai/OLMo-2-0425-1B's shape, linear scaling x2),
cold and then cached. transformers edits that dict in place while it validates the config; before the
cache key was taken from the config as given, every plan traced again (issue 20, item 5).
Goal (issue 13): under 5 s cold and under 0.5 s cached. Each figure is the median wall time and the
child's CPU time (user + system). The load average is printed with them: other jobs on a shared machine
slow every cold import alike, so compare with the baselines measured in the same run (the bundled path,
and importing torch with OPT's modeling code, the floor of any cold plan of this family).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPT_1_3B = dict(model_type="opt", architectures=["OPTForCausalLM"], hidden_size=2048, ffn_dim=8192,
                num_hidden_layers=24, num_attention_heads=32, vocab_size=50272, max_position_embeddings=2048,
                word_embed_proj_dim=2048, do_layer_norm_before=True)

OLMO2_1B_ROPE = dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, vocab_size=100352,
                     max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": 2.0})


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s: user + system of the child). CPU time is what other jobs on a shared machine
    disturb least (they stretch the wall time of every cold import alike)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median(runs: list[tuple[float, float]]) -> str:
    return (f"{statistics.median(w for w, _ in runs):6.2f} s wall, "
            f"{statistics.median(c for _, c in runs):6.2f} s CPU")


# One cold plan's parts, in a fresh process (``--split``): importing the CLI, torch and OPT's modeling code;
# counting on the meta device; tracing the two profiles a plan on 2xH100 reads (bf16 weights, and fp32
# weights under autocast; no checkpointing: every strategy fits without it).
SPLIT = """
import json, resource, sys, time
def lap(name, t=[time.perf_counter(), 0.0]):
    r = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r.ru_utime + r.ru_stime
    print(f"  {name:34s} {time.perf_counter() - t[0]:6.2f} s wall, {cpu - t[1]:6.2f} s CPU")
    t[0], t[1] = time.perf_counter(), cpu
import advisor.cli.main, advisor.planning.api, torch, transformers.models.opt.modeling_opt
lap("imports (CLI, torch, OPT modeling)")
from advisor.model.meta import build_meta_model, spec_from_module
cfg = json.loads(sys.argv[1])
spec_from_module(build_meta_model(cfg))
lap("count on the meta device")
from advisor.model.block_profile import ProfileKey
from advisor.simulate.profile_cache import traced_profiles
keys = [ProfileKey(residual_bytes=r, compute_bytes=2, input_casts=r == 4, checkpointing="off", seq_len=2048,
                   attention="sdpa", loss="hf") for r in (2, 4)]
traced_profiles(cfg, keys, cache_dir=None)
lap("trace 2 profiles")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--split", action="store_true", help="Also time a cold plan's parts in one process.")
    parser.add_argument("--rope", action="store_true", help="Time a rope_scaling config, cold then cached.")
    args = parser.parse_args()
    exe = shutil.which("advisor")
    cli = [exe] if exe else [sys.executable, "-m", "advisor.cli.main"]
    if args.rope:
        return rope(cli, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "opt-1.3b"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(OPT_1_3B))
        plan = [*cli, "plan", "--model", str(model), "--gpus", "2xH100"]
        cold, cached = [], []
        for i in range(args.repeat):
            env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / f"cache{i}")}
            cold.append(timed(plan, env))
            cached.append(timed(plan, env))
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache0")}
        bundled = [timed([*cli, "plan", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "2xH100"], env)
                   for _ in range(args.repeat)]
        no_trace = [timed([*plan, "--no-trace"], {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / f"none{i}")})
                    for i in range(args.repeat)]
        # The floor of any cold plan of this family: the interpreter, torch, transformers and OPT's modeling code.
        imports = [timed([sys.executable, "-c", "import torch, transformers.models.opt.modeling_opt"], env)
                   for _ in range(args.repeat)]
    load = os.getloadavg()[0]
    print(f"opt-1.3b plan, cold (count + trace):     {median(cold)}  (goal 5 s)")
    print(f"opt-1.3b plan, cached:                   {median(cached)}  (goal 0.5 s)")
    print(f"opt-1.3b plan --no-trace, cold counts:   {median(no_trace)}")
    print(f"Llama-3.2-1B (bundled, torch-free) plan: {median(bundled)}")
    print(f"import torch + OPT modeling code only:   {median(imports)}")
    print(f"median of {args.repeat}; load average {load:.1f} on {os.cpu_count()} CPUs")
    for i in range(args.repeat if args.split else 0):
        print(f"cold plan's parts, run {i + 1}:", flush=True)
        subprocess.run([sys.executable, "-c", SPLIT, json.dumps(OPT_1_3B)], check=True)


def rope(cli: list[str], repeat: int) -> None:
    """A rope_scaling config planned cold (count + trace) and then again from the cache, ``repeat`` times."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "olmo2-1b-rope"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(OLMO2_1B_ROPE))
        plan = [*cli, "plan", "--model", str(model), "--gpus", "2xH100", "--seq-len", "1024"]
        cold, cached = [], []
        for i in range(repeat):
            env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / f"cache{i}")}
            cold.append(timed(plan, env))
            cached.append(timed(plan, env))
    print(f"olmo2-1b rope_scaling plan, cold:        {median(cold)}")
    print(f"olmo2-1b rope_scaling plan, cached:      {median(cached)}  (goal 0.5 s; traced again before the fix)")
    print(f"median of {repeat}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
