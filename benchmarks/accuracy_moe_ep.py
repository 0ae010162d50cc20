"""One MoE layer on one expert-parallel rank: the estimate (``advisor.estimate.pipeline_experts``, what
``advisor.estimate.pipeline`` books per MoE layer under ep) against the layer simulator
(``advisor.simulate.moe_layer``, the path ``wrappers.experts`` runs, on fake tensors).

    PYTHONPATH=$PWD python benchmarks/accuracy_moe_ep.py

Writes ``benchmarks/results/accuracy_moe_ep.md`` and ``.csv``. Seconds on a CPU (fake tensors).

Shapes: the routed-expert layers of Mixtral-8x7B, Qwen1.5-MoE-A2.7B (Qwen2-MoE) and DeepSeek-V3
(widths, experts, top-k as published), bf16 as FSDP2 runs them (``recipe_dtypes`` of zero3 under
bf16-mixed), ep 1, 2 and 4, three token counts (balanced routing needs k x tokens divisible by E).
The routers as each family's estimate sees them, except DeepSeek-V3's sigmoid group-limited router,
which the layer simulator does not run: its row uses a renormalised softmax router (its own router is
checked per token against autograd's saved tensors in ``tests/estimate/test_moe_activations.py``).
Shared experts (Qwen2-MoE, DeepSeek-V3) are replicated and outside the simulated layer: left out of
both sides.

Compared, per rank:

- parameters: router + E/ep experts;
- saved: what the forward leaves for the backward (the layer's input and output excluded), the figure
  ``advisor.estimate.pipeline`` multiplies by MoE layers and micro-batches in flight;
- peak: the simulator's most live bytes over forward and backward (input, parameters, gradients
  included) against params + gradients + saved + the all-to-all buffers + the layer's input, all of
  which the estimate books at a block's backward, without the backward's working set (the step
  estimate books that per block). Not a bound: see the gaps the report lists.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MIB = 2**20

QWEN15_MOE = dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], hidden_size=2048,
                  intermediate_size=5632, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                  num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, vocab_size=151936,
                  num_experts=60, num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=1,
                  tie_word_embeddings=False)  # Qwen/Qwen1.5-MoE-A2.7B config.json
TOKENS = (480, 1920, 7680)  # k x tokens divisible by 8, 60 and 256 experts
EPS = (1, 2, 4)


def specs() -> dict:
    """name -> the spec the estimate reads (shared experts dropped: they are outside the simulated layer)."""
    from advisor.frozen import validated_copy
    from advisor.model.moe import MoeFacts
    from advisor.model.sources import resolve_model, spec_from_config

    out = {"Mixtral-8x7B": resolve_model("mistralai/Mixtral-8x7B-v0.1"),
           "Qwen1.5-MoE-A2.7B": spec_from_config(QWEN15_MOE, name="Qwen/Qwen1.5-MoE-A2.7B", source="local"),
           "DeepSeek-V3 (softmax router)": resolve_model("deepseek-ai/DeepSeek-V3")}
    for name, spec in out.items():
        moe = spec.moe or MoeFacts(router="softmax")
        router = dict(router="softmax", normalized_top_k=True) if moe.router == "sigmoid" else {}
        out[name] = validated_copy(spec, dict(moe=validated_copy(moe, dict(shared_intermediate_size=0,
                                                                             shared_gate=False, **router))))
    return out


def compare(name: str, spec, *, ep: int, tokens: int) -> dict:
    from advisor.estimate.memory import recipe_dtypes
    from advisor.estimate.pipeline_experts import moe_rank_bytes
    from advisor.simulate.moe_layer import simulate_moe_layer
    from advisor.strategies import STRATEGIES
    from advisor.training import TrainingConfig

    dt = recipe_dtypes(TrainingConfig(), STRATEGIES["zero3"].on("torch"))
    est = moe_rank_bytes(spec, dt, ep=ep, tp=1, tokens=tokens, param_bytes=dt.compute)
    moe = spec.moe
    sim = simulate_moe_layer(hidden=spec.hidden_size, expert_intermediate=spec.intermediate_size,
                             num_experts=spec.num_experts, top_k=spec.num_experts_per_token, ep=ep, tokens=tokens,
                             dtype="bfloat16", normalized_top_k=moe.normalized_top_k,
                             weights_in_compute_dtype=moe.weights_in_compute_dtype)
    layer_input = tokens * spec.hidden_size * dt.residual
    est_peak = 2 * est.params + est.saved + est.dispatch + layer_input
    return dict(model=name, ep=ep, tokens=tokens, local_experts=sim.num_local_experts,
                est_params_mib=round(est.params / MIB, 2), sim_params_mib=round(sim.params / MIB, 2),
                est_saved_mib=round(est.saved / MIB, 3), sim_saved_mib=round(sim.held_after_forward / MIB, 3),
                saved_err_pct=round(100 * (est.saved - sim.held_after_forward) / sim.held_after_forward, 3),
                est_dispatch_mib=round(est.dispatch / MIB, 2), est_imbalance_mib=round(est.imbalance / MIB, 2),
                est_peak_mib=round(est_peak / MIB, 1), sim_peak_mib=round(sim.peak / MIB, 1),
                peak_err_pct=round(100 * (est_peak - sim.peak) / sim.peak, 2))


def render(rows: list[dict]) -> list[str]:
    saved = [abs(r["saved_err_pct"]) for r in rows]
    peak = [r["peak_err_pct"] for r in rows]
    lines = ["# One MoE layer on one expert-parallel rank: estimate vs simulator", "",
             "Written by `benchmarks/accuracy_moe_ep.py` (module docstring: shapes, what is compared). bf16, "
             "tp 1, balanced dropless routing; MiB per rank. Estimate: `advisor.estimate.pipeline_experts`; "
             "simulator: `advisor.simulate.moe_layer` (the path `wrappers.experts` runs).", "",
             f"- saved for the backward: median |error| {statistics.median(saved):.3f}%, max {max(saved):.3f}% "
             f"over {len(rows)} cases",
             f"- peak (params + gradients + saved + dispatch + input): median "
             f"{statistics.median(peak):+.2f}%, range {min(peak):+.2f}% to {max(peak):+.2f}%", "",
             "| model | ep | tokens | experts here | params est / sim | saved est / sim | saved err | dispatch | "
             "imbalance (range) | peak est / sim | peak err |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['ep']} | {r['tokens']} | {r['local_experts']} | "
                     f"{r['est_params_mib']:.1f} / {r['sim_params_mib']:.1f} | {r['est_saved_mib']:.2f} / "
                     f"{r['sim_saved_mib']:.2f} | {r['saved_err_pct']:+.3f}% | {r['est_dispatch_mib']:.1f} | "
                     f"{r['est_imbalance_mib']:.1f} | {r['est_peak_mib']:.1f} / {r['sim_peak_mib']:.1f} | "
                     f"{r['peak_err_pct']:+.2f}% |")
    lines += ["", "Fixed before this table: `wrappers.experts` combined with `index_add`, which keeps its source, the "
              "k x tokens weighted rows of width h, for the backward; the estimate (transformers' path, a view and "
              "a sum over the k choices) did not count them: -5.9% (Mixtral), -17.3% (Qwen1.5-MoE), -24.1% "
              "(DeepSeek-V3) of the saved bytes at 1920 tokens. The wrapper now combines as transformers does "
              "(less memory, and the sum no longer depends on atomic adds); the ep path's own sort by local expert "
              "(two int64 vectors a row) joined the estimate under ep.", "",
              "Gaps, documented rather than corrected:", "",
              "- ep 1: the simulator still runs the ep path (its sort by local expert, 16 bytes a row); the "
              "estimate books transformers' unsharded experts, which have no such sort (-0.01% to -0.08%).",
              "- Peak: the backward's working set (gradients of the expert intermediates) is not in the per-layer "
              "figure; the step estimate books it per block (`backward_temp_bytes`). Small token counts: the "
              "simulator peaks after part of the saved tensors are freed (estimate above); 7680 tokens at ep 4: "
              "the working set outweighs what is freed (estimate up to 4% below).",
              "- The router of DeepSeek-V3 (sigmoid scores, group-limited top-k) is not in the layer simulator; "
              "its row runs a renormalised softmax router on both sides.",
              "- `wrappers.experts` loops over its local experts with one matmul each (`gate_up_proj[i]`): each "
              "expert's weight gradient is built full-size before it is accumulated, a transient of one more "
              "E/ep-expert gradient in the backward that the grouped kernels (transformers' `grouped_mm`, "
              "torchtitan's `GroupedExperts`), which the estimate and the simulator follow, do not have.",
              "- Routing imbalance is the estimate's error range (`imbalance` column, `profiles/expert_parallel.json`), "
              "not simulated (fake tensors route by shape)."]
    return lines


def main() -> None:
    rows = []
    for name, spec in specs().items():
        for ep in EPS:
            for tokens in TOKENS:
                rows.append(compare(name, spec, ep=ep, tokens=tokens))
                print(rows[-1], file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "accuracy_moe_ep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = render(rows)
    (RESULTS / "accuracy_moe_ep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
