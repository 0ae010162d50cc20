"""A model whose transformers class has no SDPA path (Gemma 2, BLOOM, MPT: ``_supports_sdpa`` False,
profiles/attention_support.json) runs eager attention unless flash or flex attention is asked for by name: the
plan's default attention for it is eager, and says so. A traced family (BLOOM) asked for SDPA is still traced
eager, the only way its class runs; building it with SDPA is refused, so the trace used to fail and fall back to a
Llama-like decoder."""

from __future__ import annotations

import warnings

import pytest

import advisor
from advisor.model.attention_support import no_sdpa_classes, runs_eager_by_default
from advisor.simulate.model import runs_attention, simulation_config
from advisor.simulate.step import simulate

pytestmark = pytest.mark.filterwarnings("ignore")

BLOOM = dict(model_type="bloom", architectures=["BloomForCausalLM"], hidden_size=64, n_head=4, n_layer=2,
             vocab_size=512, _name_or_path="tiny/bloom")


def test_the_table_is_the_installed_transformers():
    """Every listed class that the installed transformers has refuses SDPA; every causal-LM or
    conditional-generation class of it that refuses SDPA is listed."""
    transformers = pytest.importorskip("transformers")
    refusing = set()
    for name in dir(transformers):
        if not name.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")):
            continue
        try:
            cls = getattr(transformers, name)
        except Exception:  # an optional dependency missing: not a class this release can build here
            continue
        if isinstance(cls, type) and getattr(cls, "_supports_sdpa", None) is False:
            refusing.add(name)
    assert refusing == set(no_sdpa_classes())
    assert runs_eager_by_default("Gemma2ForCausalLM") and not runs_eager_by_default("LlamaForCausalLM")


def test_the_attention_a_class_runs():
    assert runs_attention(BLOOM, "sdpa") == "eager"
    assert runs_attention({**BLOOM, "architectures": ["LlamaForCausalLM"]}, "sdpa") == "sdpa"
    assert runs_attention({**BLOOM, "architectures": ["NotAClass"]}, "sdpa") == "sdpa"  # the build says what is wrong
    assert simulation_config(BLOOM, attention="sdpa")["attn_implementation"] == "eager"


def test_gemma2_plans_eager_by_default_and_sdpa_when_asked():
    default = advisor.plan("google/gemma-2-9b", gpus="1xH100", lora=None, seq_len=2048)
    asked = advisor.plan("google/gemma-2-9b", gpus="1xH100", seq_len=2048, attention="sdpa")
    assert default.training.attention == "eager" and asked.training.attention == "sdpa"
    assert any(a.startswith("attention eager (default for Gemma2ForCausalLM") for a in default.assumptions)
    assert not any(a.startswith("attention eager") for a in asked.assumptions)
    llama = advisor.plan("meta-llama/Llama-3.1-8B", gpus="1xH100", seq_len=2048)
    assert llama.training.attention == "sdpa"


@pytest.mark.parametrize("attention", [None, "sdpa"])
def test_bloom_is_traced_eager_and_matches_the_simulated_step(attention):
    """The plan's traced estimate of a tiny BLOOM (s 128, micro-batch 2, one GPU) against the simulated step:
    within 0.1%; eager by default, and traced eager when SDPA is asked for, each said once."""
    options = {} if attention is None else {"attention": attention}
    plan = advisor.plan(BLOOM, gpus="1xH100", strategy="ddp", micro_batch_size=2, seq_len=128,
                        activation_checkpointing="off", **options)
    notes = " | ".join(plan.assumptions)
    assert "tracing it failed" not in notes and not any(a.startswith("attention sdpa:") for a in plan.assumptions)
    said = "attention eager, traced so" if attention else "attention eager (default for BloomForCausalLM"
    assert notes.count(said) == 1
    estimate = next(c for c in plan.candidates if c.strategy == "ddp").memory_bytes.peak_allocated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = simulate(BLOOM, world_size=1, strategy="ddp", training=plan.training, micro_batch_size=2,
                            checkpointing=False).peak_allocated
    assert abs(estimate - measured) <= 0.001 * measured
