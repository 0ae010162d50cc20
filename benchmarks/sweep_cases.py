"""Random but realistic training jobs for ``benchmarks/sweep.py``: a tiny model config of one family and
one way to train it, drawn from a seeded ``random.Random``.

Case ``i`` of seed ``s`` is drawn from its own generator (``random.Random(f"sweep:{s}:{i}")``), so a case
does not depend on the ones before it and a sweep can be resumed or replayed one case at a time. A case
is a plain dict (JSON), identified by a hash of its contents (``case_id``).

Shapes keep each family's layout (norms, biases, MLP kind and ratio, rotary share, attention pattern,
tied or untied head: the values of the family's published configs) at a width of 64-512 and 2-4 layers
so that the CPU simulates a step in seconds; vocabularies run from 1k to 256k (log-uniform), GQA ratios
from MHA to MQA. Formula families (``profiles/architectures.json``) and families the planner traces
(``advisor.estimate.traced``) are both drawn.

What the simulator runs decides what is drawn: ddp, zero2 and zero3 (``SIMULATED_STRATEGIES``), and the
FSDP2 x TP meshes of ``advisor.simulate.mesh_step`` (full fine-tuning in fp32 or a mixed precision; no
context parallelism, whose ring attention needs CUDA). dp, zero1 and the offload strategies are not
simulated (``advisor.simulate.step.not_simulated`` says why) and so are not in the sweep.
"""

from __future__ import annotations

import hashlib
import json
import math
import random

FORMULA = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "mixtral")
TRACED = ("phi", "falcon", "opt", "gpt_neox", "stablelm", "olmo2", "gemma3_text", "cohere", "starcoder2", "granite")
KINDS = {**{f: "formula" for f in FORMULA}, **{f: "traced" for f in TRACED}}
KINDS["mixtral"] = "moe"
STRATEGIES = ("ddp", "zero2", "zero3")
# The default targets of PEFT for the formula families; a traced family gets LoRA only when the planner
# can count its adapters (``advisor.model.lora``): the sweep asks and records "unsupported" otherwise.
LORA_TARGETS = (None, None, "all-linear", ("q_proj", "v_proj"))


def case_id(case: dict) -> str:
    return hashlib.sha1(json.dumps(case, sort_keys=True).encode()).hexdigest()[:12]


def draw_case(seed: int, index: int) -> dict:
    """Case ``index`` of ``seed``: ``{"family", "kind", "config", "job"}`` (see the module docstring)."""
    rng = random.Random(f"sweep:{seed}:{index}")
    family = rng.choice(FORMULA + TRACED)
    config = draw_config(rng, family)
    job = draw_job(rng, family, config)
    return {"family": family, "kind": KINDS[family], "config": config, "job": job}


def _log_uniform(rng: random.Random, low: int, high: int, multiple: int) -> int:
    value = math.exp(rng.uniform(math.log(low), math.log(high)))
    return max(multiple, int(round(value / multiple)) * multiple)


def _attention(rng: random.Random, hidden: int) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) with heads x head_dim = hidden and a GQA ratio dividing the heads."""
    head_dim = rng.choice([d for d in (32, 64, 128) if hidden % d == 0 and hidden // d >= 1])
    heads = hidden // head_dim
    kv = rng.choice([heads // g for g in (1, 2, 4, 8, heads) if heads % g == 0])
    return heads, kv, head_dim


def draw_config(rng: random.Random, family: str) -> dict:
    """A tiny config of ``family`` (a ``transformers`` config dict)."""
    hidden = rng.choice((64, 128, 192, 256, 384, 512))
    layers = rng.randint(2, 4)
    vocab = _log_uniform(rng, 1024, 262144, 64)
    heads, kv, head_dim = _attention(rng, hidden)
    tied = rng.random() < 0.5
    common = dict(vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  _name_or_path=f"sweep/{family}-h{hidden}-l{layers}-v{vocab}")
    decoder = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                   max_position_embeddings=8192, **common)
    swiglu = _log_uniform(rng, 2 * hidden, 4 * hidden, 32)  # Llama's 8/3 h, Qwen's 5.4 h, ...
    if family in ("llama", "mistral", "qwen2", "qwen3", "granite", "olmo2", "cohere"):
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
                "cohere": "CohereForCausalLM"}[family]
        cfg = dict(model_type=family, architectures=[arch], intermediate_size=swiglu, num_key_value_heads=kv,
                   tie_word_embeddings=tied, **decoder)
        if family == "mistral":
            cfg["sliding_window"] = rng.choice((None, 4096))
        if family == "qwen3":
            cfg["head_dim"] = head_dim
        if family == "granite":  # Granite's muP multipliers (granite-3.0-2b-base)
            cfg.update(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                       logits_scaling=8.0)
        return cfg
    if family in ("gemma", "gemma2", "gemma3_text"):
        arch = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
        cfg = dict(model_type=family, architectures=[arch[family]], intermediate_size=_log_uniform(
            rng, 4 * hidden, 8 * hidden, 32), num_key_value_heads=kv, head_dim=head_dim, tie_word_embeddings=True,
            **decoder)
        if family != "gemma":
            cfg["sliding_window"] = rng.choice((256, 512, 4096))
        return cfg
    if family == "phi3":
        return dict(model_type="phi3", architectures=["Phi3ForCausalLM"], intermediate_size=swiglu,
                    num_key_value_heads=kv, tie_word_embeddings=tied, original_max_position_embeddings=8192,
                    resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, **decoder)
    if family == "mixtral":
        return dict(model_type="mixtral", architectures=["MixtralForCausalLM"], intermediate_size=swiglu,
                    num_key_value_heads=kv, tie_word_embeddings=tied, num_local_experts=rng.choice((4, 8)),
                    num_experts_per_tok=2, **decoder)
    if family == "gpt2":  # MHA, tied, learned positions
        return dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=hidden, n_layer=layers,
                    n_head=heads, n_positions=8192, resid_pdrop=rng.choice((0.0, 0.1)), embd_pdrop=0.0,
                    attn_pdrop=0.0, **common)
    if family == "phi":
        return dict(model_type="phi", architectures=["PhiForCausalLM"], intermediate_size=4 * hidden,
                    num_key_value_heads=kv, partial_rotary_factor=0.5, resid_pdrop=0.0,
                    embd_pdrop=0.0, tie_word_embeddings=False, **decoder)
    if family == "falcon":
        new = rng.random() < 0.5
        cfg = dict(model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=hidden,
                   num_hidden_layers=layers, num_attention_heads=heads, parallel_attn=True, bias=False,
                   new_decoder_architecture=new, max_position_embeddings=8192, tie_word_embeddings=tied, **common)
        if new:
            cfg["num_kv_heads"] = kv
        else:
            cfg["multi_query"] = rng.random() < 0.7
        return cfg
    if family == "opt":
        return dict(model_type="opt", architectures=["OPTForCausalLM"], hidden_size=hidden, ffn_dim=4 * hidden,
                    num_hidden_layers=layers, num_attention_heads=heads, word_embed_proj_dim=hidden,
                    do_layer_norm_before=True, dropout=rng.choice((0.0, 0.1)), max_position_embeddings=8192,
                    tie_word_embeddings=True, **common)
    if family == "gpt_neox":
        return dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], intermediate_size=4 * hidden,
                    rotary_pct=0.25, use_parallel_residual=rng.random() < 0.8, hidden_act="gelu",
                    tie_word_embeddings=False, **decoder)
    if family == "stablelm":
        return dict(model_type="stablelm", architectures=["StableLmForCausalLM"], intermediate_size=swiglu,
                    num_key_value_heads=kv, partial_rotary_factor=0.25, use_qkv_bias=rng.random() < 0.5,
                    tie_word_embeddings=False, **decoder)
    if family == "starcoder2":
        return dict(model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], intermediate_size=4 * hidden,
                    num_key_value_heads=kv, sliding_window=rng.choice((None, 4096)), residual_dropout=0.0,
                    embedding_dropout=0.0, tie_word_embeddings=True, **decoder)
    raise AssertionError(family)


def draw_job(rng: random.Random, family: str, config: dict) -> dict:
    """How the model is trained: strategy (or mesh), GPUs, micro-batch, length, checkpointing, LoRA, loss, dtypes."""
    seq = rng.choice((128, 256, 512, 1024, 2048, 4096, 8192))
    mb = rng.choice((1, 1, 2, 4, 8)) if seq <= 2048 else rng.choice((1, 1, 2))
    job = dict(seq_len=seq, micro_batch=mb, checkpointing=rng.choice(("off", "on", "selective")),
               precision=rng.choice(("bf16-mixed", "bf16-mixed", "fp16-mixed", "fp32", "bf16")),
               loss=rng.choice(("hf", "hf", "chunked", "fused")),
               optimizer=rng.choice(("adamw", "adamw", "adamw", "adam", "sgd", "sgd-momentum")),
               lora=None, world=rng.choice((1, 2, 2, 4, 8, 8, 16, 64)), strategy=rng.choice(STRATEGIES),
               tp=1, replicate=1)
    if family == "gemma2":  # soft-capped attention: transformers runs it eager only
        job["attention"] = "eager"
    if family == "mixtral":  # drawn so since the simulator's grouped matmul took bf16 only (kept: the seeds' draws)
        job["precision"] = rng.choice(("bf16-mixed", "bf16"))
    heads = config.get("num_attention_heads") or config.get("n_head")
    kv = config.get("num_key_value_heads") or config.get("num_kv_heads") or heads
    if family not in ("gpt2", "falcon", "opt", "mixtral") and job["precision"] != "bf16" and rng.random() < 0.3:
        tp = rng.choice([t for t in (2, 4) if kv % t == 0 and heads % t == 0] or [1])
        if tp > 1:  # an FSDP2 x TP mesh of 8 ranks, sometimes with replicas (HSDP)
            job.update(strategy="zero3", tp=tp, world=8, replicate=rng.choice((1, 1, 2)) if 8 // tp >= 2 else 1)
            return job
    if rng.random() < 0.4 and family != "mixtral":
        targets = rng.choice(LORA_TARGETS)
        job["lora"] = dict(rank=rng.choice((4, 8, 16, 64)), targets=list(targets) if isinstance(targets, tuple)
                           else targets, dora=rng.random() < 0.25, dropout=rng.choice((0.0, 0.0, 0.05)))
    return job


def known_gap(case: dict) -> str | None:
    """Why a case falls in a gap the sweep found and the estimate does not model yet (None: it should
    be within the goals). The full sweep still runs these cases; ``tests/test_sweep.py`` draws again.
    Each entry is a diagnosis (which moment, which buffer): remove it with the fix."""
    family, cfg, job = case["family"], case["config"], case["job"]
    if family == "gemma2" and job["strategy"] != "ddp" and job["seq_len"] <= 512 and (
            job["checkpointing"] == "off" or (job["checkpointing"] == "on" and job["precision"] == "fp32")):
        return ("gemma2 under FSDP2 at s <= 512, where a block's MLP backward (not its attention) decides in the "
                "estimate: over by +16.9% (zero2 x16 s256, the simulated peak is the loss; the estimate's in_backward "
                "buffers hold 57.6 MB, the simulated block backward 39.9 MB of temporaries), +6.1% on a tp 2 mesh, "
                "+6.7% to +10.2% in fp32 under checkpointing (+3.4% to +4.2% before Gemma 2's norms and masks were "
                "counted: the generic MLP moment's excess, gemma at the same shape +1.7%): not diagnosed further")
    if family == "gemma2" and job["checkpointing"] == "selective" and job["seq_len"] <= 512 and job["tp"] == 1:
        return ("gemma2 under selective checkpointing at s <= 512: the recomputed block's MLP backward decides and "
                "is over by +4.7% (s128, fp16-mixed, chunked) to +7.2% (s512, fp32): the selective gap's excess "
                "(recompute_bytes beside the kept linears' outputs), not eager attention's")
    if family == "gemma2" and job["strategy"] == "ddp" and cfg["hidden_size"] <= 64:
        return ("gemma2 at width 64 under DDP: with checkpointing the bottom block's backward holds every block "
                "above's gradients, which the top-block moment does not count (-5.8%, s256); with the fused loss "
                "the end of forward counts autocast's weight copies (6.4 MB) the simulated step has freed (+5.8%)")
    lora = job["lora"]
    if family == "gpt2" and lora is not None and lora["dora"] and lora["dropout"] > 0 and lora["targets"] == "all-linear":
        return ("GPT-2 DoRA with dropout on every linear: the estimate is over, +12.4% at the checkpointed block's "
                "backward (b7b311b022d6) and +11.3% at the end of forward without checkpointing; the same job without "
                "dropout is +0.17%, LoRA with dropout +0.14%, DoRA with dropout on c_attn alone +0.02% (fe92c37fd0a3): "
                "PEFT's DoRA-with-dropout path on the Conv1D layers after attention (c_proj, c_fc, mlp.c_proj) is "
                "counted as more than the simulated step holds; which tensor is not found")
    if (family == "phi" and job["strategy"] in ("zero2", "zero3") and job["world"] <= 2 and job["tp"] == 1
            and lora is None and not cfg.get("tie_word_embeddings", False)):
        return ("Phi (untied, a head bias) under FSDP2 on one or two ranks: the root's reduce-scatter holds the input, "
                "the rank's output and the embedding's gradient, referenced from C++ only (gc at the reduce-scatter: "
                "Phi and an untied Qwen2 alike), which strategy_buffers._root_backward_end counts for every untied "
                "head (GPT-NeoX and StableLM rows -7.65% / -4.07% -> -0.00%); Phi's estimate was exact without it "
                "and is over with it (67537c782116 +9.7%, 794ce1c62e76 +2.2%): its traced path counts that "
                "gradient elsewhere, not found")
    if (family == "phi" and job["tp"] > 1 and job["precision"] == "fp32" and job["checkpointing"] != "off"
            and lora is None):  # the full fine-tune's block gradients (LoRA's are the adapters' alone)
        return ("Phi on a TP mesh in fp32 under checkpointing, where a block's backward decides: -4.82% (524a0cb6d33a, "
                "found by a fresh seed 2026-11-27: zero3 tp2 x2 replicas x8, mb2 s256), the simulated step 5.13 MB "
                "above the estimate with 5.78 MB of gradients at that moment where the estimate has none: the blocks' "
                "backward gradients are not read under TP (model_parallel reads block_backward_buffers at tp 1 only). "
                "Reading them as at tp 1 over-counts (+4.78%, and +3.04% in bf16-mixed, -0.00% without); a Llama of the "
                "same shape and job is +2.03%, the same job at tp 1 -0.02%, in bf16-mixed -0.00%")
    if job["loss"] == "fused" and job["tp"] > 1:
        return ("fused loss on a TP mesh: over a vocabulary-parallel head (untied, transformers' plan) the kernel "
                "cannot run (its matmul refuses the DTensor weight: the simulated rows are errors, the planner now "
                "refuses it); over a whole head (tied, or StableLM's derived plan) StableLM is within 0.04% "
                "(0428af39138b, 36745bdb608f) and Gemma -2.8% at a block's backward (138cf9e158b4: the blocks' "
                "backward gradients are not counted under TP, model_parallel reads block_backward_buffers at tp 1 "
                "only); in fp32 over StableLM's whole head (743c5d275e20, V 156,928, -15.4%) the loss backward holds "
                "the kernel's saved fp32 head gradient and its scaled copy, where the traced profile's loss moment "
                "(split_traced) carries one: V x h x 4 bytes short (bf16-mixed, whose peak is elsewhere, -0.00%)")
    kv, heads = cfg.get("num_key_value_heads"), cfg.get("num_attention_heads")
    if (family in ("stablelm", "starcoder2") and job["precision"] == "fp32" and job["checkpointing"] != "off"
            and kv and heads and kv < heads and lora is None):
        return ("a traced GQA block (StableLM, StarCoder2) in fp32 under checkpointing, where a block's backward "
                "decides: the simulated step holds 6.69 MB more at s256 (6.70 MB at s512 and s1024) whatever the "
                "strategy and world (bd258ee4d36a, StableLM kv 1 of 16 heads, zero3 x16: -7.31%, re-simulated with "
                "CUDA's softmax-backward product of b963660, 5.05 MB and -5.79% before it; zero2 -5.03%, ddp x2 "
                "-2.26%, x8 -5.34%, measured before it; 1294a9e58f25, StarCoder2 kv 3 of 12, -3.80%); with every "
                "head its own kv (MHA), in bf16-mixed or without checkpointing it is exact (-0.01%, -0.01%, -0.47%): "
                "not diagnosed (not the fp32 math-SDPA scores, which grow as s^2, nor the expanded k/v, which grow "
                "as s)")
    if job["optimizer"] == "sgd-momentum" and job["strategy"] in ("zero2", "zero3") and job["world"] > 1:
        return ("SGD with momentum under FSDP2 on more than one rank: the simulator, not the estimate, is off at the "
                "optimizer step. On fake tensors its momentum buffers count world + 1 shards (StableLM h512, 8 layers, "
                "zero3 x16: 119,005,440 bytes = 17 x 7,000,320; x4: 5 x 28,001,280), so the simulated step peaks there "
                "(-12.8% and, in bf16-mixed, -23.8% against it); real FSDP2 on 2 gloo ranks with real tensors "
                "(torch 2.13, torch.optim.SGD(momentum=0.9)) keeps one shard each (53,568 bytes of momentum for "
                "53,568 of parameter shards on a rank). Where another moment decides, the rows are within goal")
    inter = cfg.get("intermediate_size") or 0
    if (lora is not None and lora["dora"] and job["checkpointing"] == "on" and job["strategy"] == "ddp"
            and job["precision"] in ("bf16-mixed", "fp16-mixed") and inter > job["micro_batch"] * job["seq_len"]):
        return ("DoRA under full checkpointing and autocast over fp32 weights, where the adapter's identity (in x in) "
                "outgrows the tokens (MLP width above micro-batch x sequence): the recomputed DoRA layer "
                "(activations_blocks.dora_weight_bytes, checked on real tensors in forward) is counted in a block's "
                "backward, but the simulated step holds more there: a 384-wide Qwen3, 8 x 128 tokens, DoRA r8 on every "
                "linear, ddp on one rank, MLP 1,344: -3.8% (-13.9% before the weight was counted; bf16 under zero3 "
                "-1.4%, MLP 2,688 -1.0%): which recomputed tensors are not found")
    if job["tp"] > 1 and job["loss"] == "chunked" and not cfg.get("tie_word_embeddings") and family != "stablelm":
        return ("chunked loss over a vocabulary-parallel head (untied, transformers' TP plan): the per-chunk head "
                "gradients (V/tp x h DTensor shards) are not modelled under TP; over a whole head (tied: replicated, "
                "or StableLM's derived plan) they are counted as at tp 1")
    return None
