"""Model kinds beyond the dense decoders: exact counts, an estimate, and a simulated check of it.

Run: python benchmarks/model_kinds.py [--only SUBSTRING] [--no-write]
Writes benchmarks/results/model_kinds.md and .csv.

For each model (a bundled config): the parameter count from the config (the torch-free formula
where one exists, else the meta device) against ``sum(p.numel())`` of the transformers model built
on the meta device, the active parameters, and the per-GPU estimate of one full-size plan. The CPU
cannot run the full-size step, so the simulated check (``advisor.simulate.step``, fake tensors,
PyTorch's own memory tracker) runs a scaled-down config of the same structure: the same family,
attention layout (query/key-value heads, head width), expert count and top-k, vocabulary, fewer
layers and a smaller width, stated in the table. Estimates under ``bf16-mixed`` with the torch
engine (FSDP2 for zero2/zero3: bf16 weights in compute).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

from accuracy import analytic, spec_for  # noqa: E402  (benchmarks/ is not a package)

MIXTRAL_SCALED = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=1024,
                      intermediate_size=3584, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=128, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
                      max_position_embeddings=4096, _name_or_path="scaled/mixtral")
QWEN3_MOE_SCALED = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=512,
                        intermediate_size=1536, moe_intermediate_size=192, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=1, head_dim=128, vocab_size=151936,
                        num_experts=32, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=4096,
                        _name_or_path="scaled/qwen3-moe")
DEEPSEEK_SCALED = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=512,
                       intermediate_size=1536, moe_intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=8, vocab_size=129280, n_routed_experts=32,
                       num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=1, n_group=8, topk_group=4,
                       q_lora_rank=192, kv_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=128,
                       v_head_dim=192, max_position_embeddings=4096, _name_or_path="scaled/deepseek-v3")
VL_SCALED = dict(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"], hidden_size=512,
                 intermediate_size=2688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
                 vocab_size=152064, max_position_embeddings=4096, tie_word_embeddings=False,
                 rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
                 vision_config=dict(depth=2, hidden_size=320, intermediate_size=856, num_heads=4, out_hidden_size=512,
                                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                                    fullatt_block_indexes=[1], in_chans=3),
                 _name_or_path="scaled/qwen2.5-vl")
LLAVA_SCALED = dict(model_type="llava", architectures=["LlavaForConditionalGeneration"], image_token_index=32000,
                    vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
                    tie_word_embeddings=False, _name_or_path="scaled/llava-1.5",
                    text_config=dict(model_type="llama", hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=8, vocab_size=32064,
                                     max_position_embeddings=4096),
                    vision_config=dict(model_type="clip_vision_model", hidden_size=512, intermediate_size=2048,
                                       num_hidden_layers=4, num_attention_heads=8, image_size=336, patch_size=14))
T5_SCALED = dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=512, d_ff=2048, d_kv=64,
                 num_heads=8, num_layers=4, vocab_size=32128, feed_forward_proj="relu", decoder_start_token_id=0,
                 pad_token_id=0, eos_token_id=1, _name_or_path="scaled/t5")
BART_SCALED = dict(model_type="bart", architectures=["BartForConditionalGeneration"], d_model=512, encoder_layers=4,
                   decoder_layers=4, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                   decoder_ffn_dim=2048, vocab_size=50265, max_position_embeddings=1024, dropout=0.1,
                   attention_dropout=0.1, activation_dropout=0.1, activation_function="gelu", pad_token_id=1,
                   bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, _name_or_path="scaled/bart")
MAMBA_SCALED = dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=768, intermediate_size=1536,
                    num_hidden_layers=4, state_size=16, conv_kernel=4, expand=2, time_step_rank=48, vocab_size=50280,
                    _name_or_path="scaled/mamba")
JAMBA_SCALED = dict(model_type="jamba", architectures=["JambaForCausalLM"], hidden_size=512, intermediate_size=1792,
                    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=1, vocab_size=65536,
                    num_experts=16, num_experts_per_tok=2, attn_layer_period=8, attn_layer_offset=4,
                    expert_layer_period=2, expert_layer_offset=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                    use_mamba_kernels=False, tie_word_embeddings=False, _name_or_path="scaled/jamba")


@dataclass(frozen=True)
class Kind:
    label: str
    model_id: str
    full_plan: tuple  # (strategy, world, micro-batch, seq, checkpointing)
    scaled: dict | None
    scaled_how: str
    sim_plan: tuple
    attention: str = "sdpa"
    images: int = 0  # images a sample the simulated step feeds (Llava: pixels and <image> placeholders)


KINDS = [
    Kind("MoE (Mixtral)", "mistralai/Mixtral-8x7B-v0.1", ("zero3", 8, 1, 4096, True), MIXTRAL_SCALED,
         "4 of 32 layers, width 1024 of 4096 (8 query / 2 kv heads of 128, MLP 3584): 8 experts, top-2, vocab 32000 kept",
         ("zero3", 8, 1, 2048, False)),
    Kind("MoE (Qwen3-MoE)", "Qwen/Qwen3-30B-A3B", ("zero3", 8, 1, 4096, True), QWEN3_MOE_SCALED,
         "4 of 48 layers, width 512 of 2048 (8 query / 1 kv heads of 128), 32 of 128 experts of width 192, top-8, "
         "vocab 151936 kept", ("zero3", 8, 1, 2048, False)),
    Kind("MoE + MLA (DeepSeek-V3)", "deepseek-ai/DeepSeek-V3", ("zero3", 64, 1, 4096, True), DEEPSEEK_SCALED,
         "4 of 61 layers (1 dense), width 512, 8 heads, 32 of 256 experts, top-8, v_head_dim = 192 = qk width so "
         "the CPU runs flash SDPA", ("zero3", 8, 1, 1024, False)),
    Kind("vision-language (Qwen2.5-VL)", "Qwen/Qwen2.5-VL-7B-Instruct", ("zero3", 8, 1, 4096, True), VL_SCALED,
         "4 of 28 language layers, width 512 (4 / 1 heads of 128), vision tower 2 blocks of width 320; text-only "
         "batch (the simulator feeds no pixels; ddp: FSDP2 cannot shard a tower that gets no gradient)",
         ("ddp", 2, 1, 2048, False)),
    Kind("vision-language (Llava)", "llava-hf/llava-1.5-7b-hf", ("zero3", 8, 1, 4096, True), LLAVA_SCALED,
         "4 of 32 language layers, width 512 of 4096 (8 heads of 64, MLP 1376), vocab 32064 kept; CLIP tower 4 of 24 "
         "layers, width 512 of 1024 (8 heads of 64, MLP 2048) at 336 px (577 tokens, the last layer unused); 2 images "
         "a sample (1,152 image tokens in the 2,048) fed as pixels with their <image> placeholders; the simulator "
         "keeps the unused last CLIP layer's saved tensors to the peak (28.4 MB; a real forward frees them: "
         "tests/estimate/test_llava_activations.py) and the estimate counts Adam state for that layer, which no "
         "gradient reaches (25.2 MB); with vision_feature_layer -1 (every layer used) the error is -0.00%",
         ("ddp", 2, 1, 2048, False), images=2),
    Kind("vision-language (Llava), zero3", "llava-hf/llava-1.5-7b-hf", ("zero3", 8, 1, 4096, True), LLAVA_SCALED,
         "as above under FSDP2 (the simulator's wrapper shards the language model's layers; the tower stays in the "
         "root unit, which the estimate counts gathered)", ("zero3", 2, 1, 2048, False), images=2),
    Kind("encoder-decoder (T5)", "google-t5/t5-large", ("zero3", 8, 8, 512, False), T5_SCALED,
         "4 + 4 of 24 + 24 layers, width 512 of 1024 (8 heads of 64), vocab 32128 kept; target length = source "
         "length (the simulator feeds labels = inputs); SDPA: the CPU runs the math kernel in fp32 where a GPU "
         "runs the memory-efficient one (the estimate counts the GPU's), so this row is not a check",
         ("zero3", 8, 8, 512, False)),
    Kind("encoder-decoder (T5), eager", "google-t5/t5-large", ("zero3", 8, 8, 512, False), T5_SCALED,
         "as above, --attention eager (the same ops on the CPU as on a GPU)", ("zero3", 8, 8, 512, False), "eager"),
    Kind("encoder-decoder (T5 v1.1 gated-gelu), eager", "google-t5/t5-large", ("zero3", 8, 8, 512, False),
         {**T5_SCALED, "feed_forward_proj": "gated-gelu", "_name_or_path": "scaled/t5-gated"},
         "as above with gated-gelu feed-forward (T5 v1.1 / flan-t5), --attention eager", ("zero3", 8, 8, 512, False),
         "eager"),
    Kind("encoder-decoder (BART)", "facebook/bart-large", ("zero3", 8, 8, 1024, False), BART_SCALED,
         "4 + 4 of 12 + 12 layers, width 512 of 1024 (8 heads of 64, FFN 2048), vocab 50265 kept; target length = "
         "source length", ("zero3", 8, 8, 512, False)),
    Kind("state-space (Mamba)", "state-spaces/mamba-130m-hf", ("ddp", 8, 8, 2048, False), MAMBA_SCALED,
         "4 of 24 layers, full width 768 (d_inner 1536, state 16, conv 4, dt rank 48), vocab 50280 kept",
         ("zero2", 4, 1, 256, False)),
    Kind("hybrid (Jamba)", "ai21labs/Jamba-v0.1", ("zero3", 8, 1, 4096, True), JAMBA_SCALED,
         "8 of 32 layers (attention at 4 of 8, experts on odd layers, as the full model), width 512 of 4096 (4 query / "
         "1 kv heads of 128, MLP 1792; Mamba d_inner 1024, state 16, conv 4, dt rank 32), 16 experts, top-2, vocab "
         "65536 kept; FSDP2 pure bf16 (the CPU's grouped matmul takes bf16 only)", ("zero2", 4, 1, 256, False)),
]


@dataclass(frozen=True)
class Row:
    kind: str
    model: str
    count_method: str
    total_params: int
    meta_params: int
    active_params: int
    full_plan: str
    full_estimate_gib: float
    note: str
    scaled_how: str
    sim_plan: str
    simulated_bytes: int
    analytic_bytes: int
    error_pct: float
    simulate_s: float


@contextlib.contextmanager
def _fed_images(kind: Kind, spec):
    """Llava's forward given ``kind.images`` images a sample: random 336 px pixels (fp32, as the
    processor returns them) and that many runs of <image> placeholders at the start of each sample's
    tokens. The simulator feeds token ids alone, so the benchmark wraps the class's forward; under fake
    tensors the placeholder count cannot be read, so transformers' count check is switched off
    (TRANSFORMERS_DISABLE_TORCH_CHECK)."""
    if not kind.images:
        yield
        return
    import torch
    import transformers

    cls, original = transformers.LlavaForConditionalGeneration, transformers.LlavaForConditionalGeneration.forward
    side, count = kind.scaled["vision_config"]["image_size"], kind.images * spec.tokens_per_image

    def forward(self, input_ids=None, **kwargs):
        ids = input_ids.clone()
        ids[:, 1:1 + count] = self.config.image_token_id
        pixels = torch.randn(ids.shape[0] * kind.images, 3, side, side)
        return original(self, input_ids=ids, pixel_values=pixels, **kwargs)

    before = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = original
        if before is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK")
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = before


def _plan_text(plan: tuple) -> str:
    strategy, world, mb, seq, ckpt = plan
    return f"{strategy} {world}xH100 mb {mb} seq {seq}{' ckpt' if ckpt else ''}"


def run(kind: Kind) -> Row:
    from advisor.estimate.activations import shape_of
    from advisor.estimate.memory import estimate_memory
    from advisor.hardware.cluster import parse_gpus
    from advisor.strategies import get_strategy
    from advisor.model.meta import build_meta_model
    from advisor.model.sources import resolve
    from advisor.simulate.step import simulate
    from advisor.training import TrainingConfig

    spec, cfg = resolve(kind.model_id)
    meta = sum(p.numel() for p in build_meta_model(cfg).parameters())
    strategy, world, mb, seq, ckpt = kind.full_plan
    full = analytic(kind.model_id, strategy, world, mb, seq, ckpt)
    s_strategy, s_world, s_mb, s_seq, s_ckpt = kind.sim_plan
    start = time.perf_counter()
    training = TrainingConfig(seq_len=s_seq, attention=kind.attention)
    scaled = spec_for(kind.scaled)
    with _fed_images(kind, scaled):
        sim = simulate(kind.scaled, world_size=s_world, strategy=s_strategy, training=training,
                       micro_batch_size=s_mb, checkpointing=s_ckpt)
    elapsed = time.perf_counter() - start
    if kind.images:  # the estimate adds the image tokens to --seq-len: the same 2,048 tokens in all
        training = TrainingConfig(seq_len=s_seq - kind.images * scaled.tokens_per_image, images_per_sample=kind.images,
                                  attention=kind.attention)
    est = estimate_memory(scaled, parse_gpus(f"{s_world}xH100"), training,
                          get_strategy(s_strategy).on("torch"), micro_batch_size=s_mb, checkpointing=s_ckpt)
    error = 100 * (est.peak_allocated - sim.peak_allocated) / sim.peak_allocated
    return Row(kind.label, kind.model_id, spec.count_method, spec.total_params, meta, spec.active_params,
               _plan_text(kind.full_plan), round(full.peak_allocated / 2**30, 2), shape_of(spec).note or "",
               kind.scaled_how, _plan_text(kind.sim_plan), sim.peak_allocated, est.peak_allocated, round(error, 2),
               round(elapsed, 1))


def _merged(rows: list[Row]) -> list[Row]:
    """The rows just run, with the other kinds' rows kept from the last CSV (a run with --only)."""
    path, fresh = RESULTS / "model_kinds.csv", {r.kind: r for r in rows}
    if path.exists():
        types = {name: type(getattr(rows[0], name)) for name in asdict(rows[0])}
        with open(path, newline="") as f:
            for old in csv.DictReader(f):
                fresh.setdefault(old["kind"], Row(**{k: types[k](v) for k, v in old.items()}))
    order = [k.label for k in KINDS]
    return sorted(fresh.values(), key=lambda r: order.index(r.kind) if r.kind in order else len(order))


def write(rows: list[Row]) -> None:
    RESULTS.mkdir(exist_ok=True)
    rows = _merged(rows)
    with open(RESULTS / "model_kinds.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    lines = ["# Model kinds: exact counts, an estimate, a simulated check", "",
             "Produced by `python benchmarks/model_kinds.py` (bf16-mixed, torch engine, AdamW). Counts: the "
             "advisor's count from the bundled config (`formula`: torch-free; `meta_device`: the model built on "
             "the meta device) against `sum(p.numel())` of the transformers 5.x model on the meta device. The "
             "simulated check runs a scaled-down config of the same structure (how: last table) on fake tensors "
             "and compares the per-GPU `peak_allocated` with the analytic estimate.", "",
             "| kind | model | count | total | = meta | active | full-size plan | estimate GiB/GPU |",
             "|---|---|---|---:|---|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.model} | {r.count_method} | {r.total_params:,} | "
                     f"{'yes' if r.total_params == r.meta_params else f'NO ({r.meta_params:,})'} | "
                     f"{r.active_params:,} | {r.full_plan} | {r.full_estimate_gib:.2f} |")
    lines += ["", "| kind | scaled-down config | simulated plan | simulated GiB | analytic GiB | error | sim s |",
              "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.scaled_how} | {r.sim_plan} | {r.simulated_bytes / 2**30:.3f} | "
                     f"{r.analytic_bytes / 2**30:.3f} | {r.error_pct:+.2f}% | {r.simulate_s:.0f} |")
    lines += ["", "What the estimate says it does not model (the plan's note for each model):", ""]
    lines += [f"- {r.kind}: {r.note or 'nothing beyond the standard assumptions'}" for r in rows]
    (RESULTS / "model_kinds.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run the kinds whose label contains this.")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for kind in KINDS:
        if args.only.lower() not in kind.label.lower():
            continue
        row = run(kind)
        rows.append(row)
        print(f"{row.kind:32} total {row.total_params:>16,} meta {'=' if row.total_params == row.meta_params else '!='} "
              f"active {row.active_params:>16,} full {row.full_estimate_gib:8.2f} GiB | scaled sim "
              f"{row.simulated_bytes / 2**30:7.3f} est {row.analytic_bytes / 2**30:7.3f} {row.error_pct:+6.2f}% "
              f"({row.simulate_s:.0f} s)", flush=True)
    if rows and not args.no_write:
        write(rows)


if __name__ == "__main__":
    main()
