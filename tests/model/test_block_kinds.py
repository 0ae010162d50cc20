"""The block-kind registry (``advisor.model.block_kinds``, ``advisor.estimate.activation_kinds``): every
bundled model is detected as exactly one kind, the one its config's model_type and facts say (read from
the configs by hand), each row names modules that exist, and the two tables have the same rows."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from advisor.estimate.activation_kinds import ACTIVATION_KINDS
from advisor.estimate.activations import shape_of
from advisor.model.block_kinds import KIND_NAMES, KINDS, kind_of, kinds_detecting
from advisor.model.bundled import bundled_model_ids, load_bundled_config
from advisor.model.sources import spec_from_config
from advisor.model.spec import ModelSpec, spec_from_size

# By hand from profiles/models/*: model_type, and the experts / hybrid layer pattern the configs give.
EXPECTED = {"Qwen/Qwen2.5-VL-7B-Instruct": "qwen_vl", "Qwen/Qwen3-30B-A3B": "moe", "ai21labs/Jamba-v0.1": "jamba",
            "deepseek-ai/DeepSeek-V3": "moe", "facebook/bart-large": "encdec", "google-t5/t5-large": "encdec",
            "bigscience/T0_3B": "encdec", "bigscience/mt0-xxl": "encdec",
            "llava-hf/llava-1.5-7b-hf": "llava", "mistralai/Mixtral-8x7B-v0.1": "moe",
            "state-spaces/mamba-130m-hf": "mamba", "google-bert/bert-base-uncased": "bert",
            "google-bert/bert-large-uncased": "bert"}
EXPECTED |= {f"openai-community/{name}": "gpt2" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
FACTS = ("moe", "mla", "vision", "ssm", "encdec", "hybrid")


def _bundled(model_id: str) -> ModelSpec:
    return spec_from_config(load_bundled_config(model_id), name=model_id, source="bundled")


@pytest.mark.parametrize("model_id", bundled_model_ids())
def test_every_bundled_model_is_exactly_one_kind(model_id):
    spec = _bundled(model_id)
    assert kinds_detecting(spec) == (EXPECTED.get(model_id, "decoder"),)
    kind = kind_of(spec)
    for name in FACTS:  # each facts object the spec carries is one its kind declares, of a declared type
        value = getattr(spec, name)
        if value is not None:
            assert name in kind.facts and isinstance(value, kind.facts[name]), (model_id, name)
    shape = shape_of(spec)
    assert (shape.kind, shape.family) == (kind.name, kind.family)


def _spec(**fields) -> ModelSpec:
    return ModelSpec(name="x", source="local", count_method="meta_device", total_params=10**9,
                     trainable_params=10**9, **fields)


SHAPED = dict(num_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=1000)


@pytest.mark.parametrize(("spec", "kind"), [
    (spec_from_size(7 * 10**9), "size"),
    (_spec(model_type="gpt_neox", **SHAPED), "gpt_neox"),  # counted on the meta device, a formula of its own
    (_spec(model_type="opt", **SHAPED), "unknown"),  # no formula: traced, or a Llama-like decoder assumed
    (_spec(**SHAPED), "decoder"),  # a live module with the shape fields and no model_type
    (_spec(model_type="vit", num_layers=4, hidden_size=256), "none"),  # no token embeddings
    (_spec(model_type="opt", hidden_size=256, vocab_size=1000), "guessed"),  # some shape fields missing
], ids=lambda value: value if isinstance(value, str) else "")
def test_specs_without_a_bundled_config_are_one_kind(spec, kind):
    assert kinds_detecting(spec) == (kind,)
    assert shape_of(spec).family == next(row.family for row in KINDS if row.name == kind)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_NAMES)
def test_each_kind_names_modules_that_exist_and_an_activation_row(kind):
    assert importlib.util.find_spec(kind.model_module) is not None
    assert importlib.util.find_spec(kind.activation_module) is not None
    assert ACTIVATION_KINDS[kind.name].name == kind.name


def test_the_two_tables_have_the_same_rows_in_the_same_order():
    assert tuple(ACTIVATION_KINDS) == KIND_NAMES
    assert len(set(KIND_NAMES)) == len(KIND_NAMES) == 14


CONVERTED = ("advisor/estimate/activations.py", "advisor/estimate/memory.py", "advisor/estimate/model_parallel.py",
             "advisor/estimate/traced.py", "advisor/model/lora.py", "advisor/planning/notes.py",
             "advisor/planning/pipeline_meshes.py")


@pytest.mark.parametrize("path", CONVERTED)
def test_converted_dispatch_sites_read_the_registry_not_the_facts_fields(path):
    """These modules ask the spec's kind; a test of ``spec.moe`` (``mla``, ``vision``, ``ssm``, ``encdec``,
    ``hybrid``) there would be a second place a family is dispatched."""
    source = (Path(__file__).resolve().parents[2] / path).read_text()
    assert re.findall(r"\bspec\.(?:moe|mla|vision|ssm|encdec|hybrid)\b", source) == []
