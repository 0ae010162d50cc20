"""Fuzz corpus for ``advisor plan`` (issue 21, items 8 and 16): hostile config values and options.

Every example runs the CLI in-process (``advisor.cli.main.main``) under a hard per-example deadline
and asserts: exit code 0, 2 or 3 (1 is a bug of ours); no traceback; an error is one line; and no
count is planned from a wrongly typed value: a config whose key was given a value of the wrong type
either is refused (exit 2) or plans exactly the parameters of the config without that key, measured
by planning that config (so a key the counting formulas never read may hold anything).

Seeds are configs the formulas count (no torch import, milliseconds each): tiny ones built in
``tests/conftest.py`` and bundled full-size ones (DeepSeek-V3's MLA, Qwen2.5-VL's vision tower, Jamba,
T5, Mamba). ``derandomize=True``: CI sees the same examples every run; the whole file takes well
under a minute on a 2-core box.
"""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from advisor.model.bundled import load_bundled_config
from tests.cli._main import run_main
from tests.conftest import TINY_CONFIGS

SEEDS = {
    **{name: TINY_CONFIGS[name] for name in ("llama_gqa_untied", "llama_tied_bias", "qwen2_bias_gqa", "mixtral_moe",
                                              "gpt2_mha", "bert_mlm")},
    **{name: load_bundled_config(name) for name in ("deepseek-ai/DeepSeek-V3", "Qwen/Qwen2.5-VL-7B-Instruct",
                                                    "ai21labs/Jamba-v0.1", "google-t5/t5-large",
                                                    "state-spaces/mamba-130m-hf", "Qwen/Qwen3-30B-A3B")},
}
# Keys a config may legitimately hold below zero, or that name tokens rather than sizes.
_SIGNED = ("vision_feature_layer", "ignore_index")
# Keys the counting formulas read that a seed may lack: added with a wrong type, they must be refused
# or leave the count alone.
# (key: a value of its type, to tell a wrong type from a right one)
_ADDED = {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "head_dim": 64,
          "num_key_value_heads": 2, "qk_rope_head_dim": 64, "out_hidden_size": 64, "intermediate_size": 64,
          "norm_topk_prob": False}
# No "explain" phase: it re-runs a failing example under a tracer, which makes importing torch (the
# meta-device path) take minutes.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None, phases=_PHASES,
                    suppress_health_check=list(HealthCheck))


class Hang(BaseException):
    """Raised by the alarm: not an Exception, so the CLI's own handlers cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float):
    def ring(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return type(value).__name__


def _nested(depth: int, leaf):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


HOSTILE = st.one_of(
    st.sampled_from(["false", "true", "0", "1", "", "64", "llama", "auto", "nan", "-1"]),
    st.booleans(),
    st.sampled_from([0, -1, -64, 1, 2**31, 2**63, 10**18]),
    st.integers(min_value=10, max_value=400).map(lambda k: 10**k),
    st.sampled_from([0.0, 0.5, 2.0, -2.0, 1e308, -1e308]),
    st.none(),
    st.builds(_nested, st.integers(1, 60), st.sampled_from([64, "x", True, None])),
    st.dictionaries(st.sampled_from(["a", "hidden_size", "type"]), st.sampled_from([1, "x", True]), max_size=2),
)


def _run_plan(cfg: dict, directory: Path, capsys) -> tuple[int, str, str]:
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    with deadline(20):
        return run_main(["plan", "-m", str(directory), "-g", "2xA100", "--json", "--no-trace"], capsys)


def _check_outcome(code: int, out: str, err: str) -> dict | None:
    assert code in (0, 2, 3), (code, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
        return None
    return json.loads(out)


_BASE_TOTALS: dict[str, int | None] = {}


def _total(cfg: dict, directory: Path, capsys) -> int | None:
    code, out, err = _run_plan(cfg, directory, capsys)
    doc = _check_outcome(code, out, err)
    return None if doc is None else doc["model"]["total_params"]


def _is_wrong_type(original, value) -> bool:
    """Whether ``value`` cannot be a value of the key that held ``original``: another JSON type (bool and
    int apart), or below zero where the seed had a positive size."""
    if original is None:
        return value is not None  # a key the seed held as null
    if _kind(value) != _kind(original):
        return value is not None  # null: "not set", which transformers reads as the default
    return _kind(value) == "int" and isinstance(original, int) and original > 0 and value < 0


@st.composite
def mutations(draw):
    seed = draw(st.sampled_from(sorted(SEEDS)))
    cfg = json.loads(json.dumps(SEEDS[seed]))
    places = [(None, k) for k in cfg if not k.startswith("_") and k not in ("model_type",)]
    places += [(sub, k) for sub in ("text_config", "vision_config") if isinstance(cfg.get(sub), dict)
               for k in cfg[sub]]
    places += [(None, k) for k in _ADDED if k not in cfg]
    sub, key = draw(st.sampled_from(places))
    value = draw(HOSTILE)
    return seed, sub, key, value


@SETTINGS
@given(mutations())
def test_a_hostile_config_value_is_refused_or_leaves_the_count_alone(tmp_path_factory, capsys, mutation):
    seed, sub, key, value = mutation
    directory = tmp_path_factory.mktemp("fuzz")
    cfg = json.loads(json.dumps(SEEDS[seed]))
    target = cfg if sub is None else cfg[sub]
    original = target.get(key, _ADDED.get(key) if sub is None else None)
    target[key] = value
    code, out, err = _run_plan(cfg, directory / "mutated", capsys)
    doc = _check_outcome(code, out, err)
    if doc is None or key in _SIGNED or key.endswith(("_id", "_index")) or not _is_wrong_type(original, value):
        return
    without = json.loads(json.dumps(SEEDS[seed]))
    (without if sub is None else without[sub]).pop(key, None)
    cache_key = f"{seed}/{sub}/{key}"
    if cache_key not in _BASE_TOTALS:
        _BASE_TOTALS[cache_key] = _total(without, directory / "without", capsys)
    assert doc["model"]["total_params"] == _BASE_TOTALS[cache_key], (
        f"{sub or ''}.{key}={value!r:.60} was planned with {doc['model']['total_params']:,} parameters; "
        f"without the key {_BASE_TOTALS[cache_key]}")


NUMBERS = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "7", "inf", "-inf", "nan", "1e400", "0.5", "1e-9", "", " ", "auto", "max",
                     "1" + "0" * 400, "9" * 30, "0x10", "1_000", "٣", "1%", "100%", "0%", "7.5B", "1T", "-5B"]),
    st.integers(-10**6, 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
GPUS = st.one_of(st.sampled_from(["2xA100", "8xH100", "2x8xH100", "0xA100", "1x0xH100", "x", "", "8x", "A100",
                                  "99999999xH100", "2xA100x2", "-1xH100", "2xNOPE", "2x8x8xH100", "1e9xH100"]),
                 st.text(max_size=12))
OPTIONS = ["--seq-len", "--micro-batch", "--global-batch", "--target-len", "--images-per-sample", "--image-size",
           "--trainable-params", "--lora", "--lora-dropout", "--reserve-gib", "--context-gib", "--headroom",
           "--cpu-memory-gib", "--tp", "--cp", "--hybrid", "--nodes", "--params"]
CHOICES = {"--strategy": ["ddp", "zero1", "zero2", "zero3", "zero3_offload", "dp", "nope"],
           "--precision": ["bf16-mixed", "fp32", "fp16-mixed", "bf16", "x"],
           "--activation-checkpointing": ["on", "off", "selective", "x"], "--loss": ["hf", "chunked", "fused", "x"],
           "--quantize": ["nf4", "int8", "x"], "--engine": ["torch", "deepspeed", "x"],
           "--policy": ["fastest", "practical", "x"], "--margin": ["expected", "high", "low", "x"]}


@st.composite
def command_lines(draw):
    args = ["plan", "-g", draw(GPUS)]
    if draw(st.booleans()):
        args += ["-m", draw(st.sampled_from(["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B", "~nouser/x", "",
                                              "Qwen/Qwen3-30B-A3B", "7.5B", "-", "a/b/c", "deepseek-ai/DeepSeek-V3"]))]
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            option = draw(st.sampled_from(OPTIONS))
            args += [option, draw(NUMBERS)]
        else:
            option = draw(st.sampled_from(sorted(CHOICES)))
            args += [option, draw(st.sampled_from(CHOICES[option]))]
    return args


@settings(max_examples=400, deadline=None, derandomize=True, database=None, phases=_PHASES,
          suppress_health_check=list(HealthCheck))
@given(command_lines())
def test_hostile_options_exit_cleanly(capsys, monkeypatch, args):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a Hub-looking id must fail at once, not try the network
    with deadline(20):
        code, out, err = run_main([*args, "--no-trace"], capsys)
    assert code in (0, 2, 3), (args, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (args, err)


@pytest.mark.parametrize("args", [
    ["plan", "-m", "meta-llama/Llama-3.1-70B", "-g", "8x8xA100", "--seq-len", "8192", "--global-batch", "64",
     "--strategy", "zero3", "--tp", "8", "--micro-batch", "8", "--activation-checkpointing", "on"],
    ["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "8xH100", "--global-batch", "16", "--micro-batch", "3", "--tp", "2"],
    ["plan", "-m", "Qwen/Qwen2.5-0.5B", "-g", "2xA100", "--seq-len", "max", "--micro-batch", "4"],
])
def test_corpus_regressions(capsys, args):
    """Command lines that once ended in a traceback (kept even if the strategies above stop drawing them)."""
    with deadline(30):
        code, _, err = run_main(args, capsys)
    assert code in (0, 2, 3) and "Traceback" not in err, err
