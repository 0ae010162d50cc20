"""Held-out accuracy: the default ``advisor plan`` estimate for families with no activation formula
(traced block profiles, ``advisor.simulate.profile``) against one training step PyTorch really runs
(``advisor.simulate.step``, fake tensors on the CPU), and the old Llama-like fallback (``--no-trace``).

Run: python benchmarks/accuracy_heldout.py [--only SUBSTRING] [--no-write]
Prints per case the simulated and estimated ``peak_allocated`` and the error of each estimate, then
the median and maximum absolute error per family; writes benchmarks/results/accuracy_heldout.md.
Goal (issue 13): the traced estimate within 3% of the simulator on every case.

The configs are built here, scaled down from each family's published model (same layout: norms,
biases, MLP kind, rotary share, attention pattern; width 512, 4 layers, vocabulary 16,000) so that
the CPU simulates a step in seconds. Only OPT, Phi, Falcon and Gemma 3 were looked at while the
tracer was written (a Falcon case showed batch 1 taking another SDPA path; Gemma 3 needed the model
built outside the fake mode); StableLM, OLMo 2, GPT-J and Cohere were run once, as they are.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# Layouts from: facebook/opt-125m (pre-LayerNorm, learned positions, ReLU), microsoft/phi-1_5 (parallel
# attention + MLP, partial rotary), tiiuae/falcon-7b (parallel attention, multi-query), stabilityai/
# stablelm-2-1_6b (LayerNorm, partial rotary, qkv bias), google/gemma-3-1b-pt (gemma3_text: sliding window,
# q/k norms, four norms a block), allenai/OLMo-2-0425-1B (post-norms, q/k norms), EleutherAI/gpt-j-6b
# (parallel residual, rotary_dim), CohereForAI/c4ai-command-r-v01 (parallel block, LayerNorm); widths,
# depths and vocabularies scaled down. (Phi-3 and Qwen3 have the decoder formula: not held out.)
MODELS = {
    "opt": dict(model_type="opt", architectures=["OPTForCausalLM"], hidden_size=512, ffn_dim=2048,
                num_hidden_layers=4, num_attention_heads=8, vocab_size=16000, max_position_embeddings=2048,
                word_embed_proj_dim=512, do_layer_norm_before=True, dropout=0.1),
    "phi": dict(model_type="phi", architectures=["PhiForCausalLM"], hidden_size=512, intermediate_size=2048,
                num_hidden_layers=4, num_attention_heads=8, vocab_size=16000, partial_rotary_factor=0.5,
                max_position_embeddings=2048, resid_pdrop=0.0, embd_pdrop=0.0),
    "falcon": dict(model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=512, num_hidden_layers=4,
                   num_attention_heads=8, vocab_size=16000, multi_query=True, parallel_attn=True, bias=False,
                   new_decoder_architecture=False),
    "stablelm": dict(model_type="stablelm", architectures=["StableLmForCausalLM"], hidden_size=512,
                     intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                     vocab_size=16000, partial_rotary_factor=0.25, use_qkv_bias=True, max_position_embeddings=2048),
    "gemma3": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=512,
                   intermediate_size=2048, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
                   head_dim=128, vocab_size=16000, sliding_window=256, max_position_embeddings=4096),
    "olmo2": dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], hidden_size=512, intermediate_size=1408,
                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, vocab_size=16000,
                  max_position_embeddings=4096),
    "gptj": dict(model_type="gptj", architectures=["GPTJForCausalLM"], n_embd=512, n_layer=4, n_head=8,
                 rotary_dim=32, vocab_size=16000, n_positions=2048, resid_pdrop=0.0, embd_pdrop=0.0),
    "cohere": dict(model_type="cohere", architectures=["CohereForCausalLM"], hidden_size=512,
                   intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                   vocab_size=16000, max_position_embeddings=4096),
}

# GPT-J has no SDPA path in transformers: it runs eager attention (its s^2 scores are in every figure).
ATTENTION = {"gptj": "eager"}

# (model, strategy, world, micro-batch, sequence, checkpointing)
SHAPES = [("ddp", 2, 2, 512, False), ("zero2", 2, 2, 1024, False), ("zero3", 2, 2, 1024, False),
          ("zero3", 4, 1, 1024, True), ("ddp", 1, 4, 512, True)]
CASES = [(model, *shape) for model in MODELS for shape in SHAPES]


def estimate(cfg: dict, strategy: str, world: int, mb: int, seq: int, ckpt: bool, *, trace: bool,
             attention: str) -> int:
    """``advisor.plan``'s estimate for this one configuration (the default path traces)."""
    from advisor.planning.api import plan

    result = plan(dict(cfg), gpus=f"{world}xH100", strategy=strategy, micro_batch_size=mb, seq_len=seq,
                  activation_checkpointing="on" if ckpt else "off", attention=attention, trace=trace)
    return result.candidate(strategy).memory_bytes.peak_allocated


def simulated(cfg: dict, strategy: str, world: int, mb: int, seq: int, ckpt: bool, *, attention: str) -> int:
    from advisor.simulate.step import simulate
    from advisor.training import TrainingConfig

    training = TrainingConfig(seq_len=seq, attention=attention)
    return simulate(dict(cfg), world_size=world, strategy=strategy, training=training,
                    micro_batch_size=mb, checkpointing=ckpt).peak_allocated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run only cases containing this text (their CSV rows are updated).")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for model, strategy, world, mb, seq, ckpt in CASES:
        case = f"{model} {strategy} x{world} mb{mb} s{seq} {'ckpt' if ckpt else 'no-ckpt'}"
        if args.only not in case:
            continue
        cfg = {**MODELS[model], "_name_or_path": f"heldout/{model}"}
        attention = ATTENTION.get(model, "sdpa")
        start = time.perf_counter()
        sim = simulated(cfg, strategy, world, mb, seq, ckpt, attention=attention)
        try:
            traced = estimate(cfg, strategy, world, mb, seq, ckpt, trace=True, attention=attention)
        except ValueError as err:  # reported, and counted as a failure
            print(f"{case:40s} FAILED: {err}", flush=True)
            rows.append((model, case, sim, 0, float("nan"), 0, float("nan")))
            continue
        fallback = estimate(cfg, strategy, world, mb, seq, ckpt, trace=False, attention=attention)
        row = (model, case, sim, traced, 100 * (traced - sim) / sim, fallback, 100 * (fallback - sim) / sim)
        rows.append(row)
        if not args.no_write:
            _merge([row])  # saved as it goes: a long run that stops keeps its finished cases
        print(f"{case:40s} sim {sim / 2**20:9.1f} MiB  traced {row[4]:+6.2f}%  llama-like {row[6]:+6.2f}%  "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    print("\n".join(_table(rows)))
    if not args.no_write:  # --only updates its rows of the CSV; the table is made from the whole CSV
        rows = _merge(rows)
        (RESULTS / "accuracy_heldout.md").write_text("\n".join(_header() + _table(rows)) + "\n")
    return 0 if all(abs(r[4]) <= 3 for r in rows) else 1  # a failed case (nan) fails the goal


def _merge(rows: list) -> list:
    path = RESULTS / "accuracy_heldout.csv"
    RESULTS.mkdir(exist_ok=True)
    old = {}
    if path.exists():
        with path.open() as f:
            for r in csv.reader(f):
                if r and r[0] != "family":
                    old[r[1]] = (r[0], r[1], int(r[2]), int(r[3]), float(r[4]), int(r[5]), float(r[6]))
    old.update({r[1]: r for r in rows})
    order = {f"{m} {s} x{w} mb{b} s{q} {'ckpt' if c else 'no-ckpt'}": i for i, (m, s, w, b, q, c) in enumerate(CASES)}
    merged = sorted(old.values(), key=lambda r: order.get(r[1], len(order)))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["family", "case", "simulated_bytes", "traced_bytes", "traced_err_pct", "llama_like_bytes",
                      "llama_like_err_pct"])
        out.writerows(merged)
    return merged


def _header() -> list[str]:
    import torch
    import transformers

    return ["# Held-out accuracy: default plan (traced profile) vs the simulator", "",
            f"`python benchmarks/accuracy_heldout.py` (torch {torch.__version__}, transformers "
            f"{transformers.__version__}); peak allocated per GPU, bf16-mixed, AdamW, hf loss, SDPA (GPT-J: eager, "
            "it has no SDPA path). Configs built in the script, scaled down from each family's published small "
            "model (width 512, 4 layers, vocabulary 16,000; the family's own norms, biases, MLP, rotary share and "
            "attention layout). 'traced' is the default `advisor plan` (profiles traced at 1-2 blocks, batch 1-2); "
            "'llama-like' is `--no-trace` (the fallback before). Simulated: `advisor.simulate.step` (fake tensors, "
            "CPU).", ""]


def _table(rows: list) -> list[str]:
    out = ["| case | simulated MiB | traced MiB | traced err % | llama-like err % |", "|---|---:|---:|---:|---:|"]
    for _, case, sim, traced, err, _, old in rows:
        out.append(f"| {case} | {sim / 2**20:.1f} | {traced / 2**20:.1f} | {err:+.2f} | {old:+.2f} |")
    out += ["", "| family | cases | traced median abs % | traced max abs % | llama-like median abs % | llama-like max abs % |",
            "|---|---:|---:|---:|---:|---:|"]
    families = dict.fromkeys(r[0] for r in rows)
    for fam in list(families) + ["all"]:
        sel = [r for r in rows if fam in ("all", r[0])]
        t, o = [abs(r[4]) for r in sel], [abs(r[6]) for r in sel]
        out.append(f"| {fam} | {len(sel)} | {statistics.median(t):.2f} | {max(t):.2f} | {statistics.median(o):.2f} | "
                   f"{max(o):.2f} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
