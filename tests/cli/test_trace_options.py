"""``advisor plan`` on a family with no activation formula: traced by default (the note says so),
``--no-trace`` keeps the Llama-like assumption, and a model that ships its own code without
``--trust-remote-code`` is one line naming the path that failed, exit 2 (issue 13's bad input)."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli._main import run_main

OPT = dict(model_type="opt", architectures=["OPTForCausalLM"], hidden_size=64, ffn_dim=256, num_hidden_layers=2,
           num_attention_heads=4, vocab_size=512, max_position_embeddings=256, word_embed_proj_dim=64)
CUSTOM = dict(model_type="my_custom_lm", architectures=["MyCustomForCausalLM"], hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, vocab_size=512,
              auto_map={"AutoConfig": "configuration_my.MyConfig", "AutoModelForCausalLM": "modeling_my.MyForCausalLM"})


def _model_dir(tmp_path, cfg: dict) -> str:
    folder = tmp_path / cfg["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_plan_traces_by_default_and_no_trace_keeps_the_llama_like_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = _model_dir(tmp_path, OPT)
    args = ["plan", "--model", model, "--gpus", "1xH100", "--strategy", "ddp", "--seq-len", "64",
            "--activation-checkpointing", "off", "--json"]
    code, out, err = run_main(args, capsys)
    assert code == 0
    notes = json.loads(out)["assumptions"]  # stdout is the one JSON document: the progress went to stderr
    assert any("activations traced on fake tensors" in n for n in notes)
    assert list((tmp_path / "cache" / "dp-advisor" / "profiles").iterdir())  # cached for the next plan
    # Tracing takes seconds: one line when it starts, one with how long it took.
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "tracing" in lines[0] and re.fullmatch(r"advisor: traced in \d+\.\d s", lines[1]), err
    code, out, err = run_main(args, capsys)  # from the cache: nothing to wait for, nothing said
    assert code == 0 and err == "" and json.loads(out)["assumptions"] == notes
    code, out, _ = run_main([*args, "--no-trace"], capsys)
    notes = json.loads(out)["assumptions"]
    assert code == 0
    assert not any("traced" in n for n in notes)
    assert any("activations assume a Llama-like decoder" in n for n in notes)


def test_inspect_keeps_the_meta_device_count_where_plan_keeps_it(tmp_path, monkeypatch, capsys):
    """A review: inspect of a family without a formula built the model on the meta device every time (7 s), while
    plan reads the count from its cache; inspect now writes and reads the same entry."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = _model_dir(tmp_path, OPT)
    code, first, _ = run_main(["inspect", model, "--json"], capsys)
    specs = tmp_path / "cache" / "dp-advisor" / "specs"
    assert code == 0 and len(list(specs.iterdir())) == 1
    monkeypatch.setattr("advisor.model.meta.build_meta_model", lambda *a, **k: pytest.fail("counted again"))
    code, again, _ = run_main(["inspect", model, "--json"], capsys)
    assert code == 0 and again == first


def test_custom_code_without_trust_is_one_line_and_exit_2(tmp_path, capsys):
    code, out, err = run_main(["plan", "--model", _model_dir(tmp_path, CUSTOM), "--gpus", "1xH100"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "meta device" in lines[0] and "--trust-remote-code" in lines[0] and "my_custom_lm" in lines[0]


T5 = dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=64, d_kv=16, d_ff=128, num_layers=2,
          num_decoder_layers=2, num_heads=4, vocab_size=512, feed_forward_proj="relu", relative_attention_num_buckets=8,
          relative_attention_max_distance=16, tie_word_embeddings=True, decoder_start_token_id=0)


def test_encoder_decoder_keeps_its_formula_and_traces_nothing(tmp_path, monkeypatch, capsys):
    """T5 and BART have a formula for both stacks (activations_encdec, checked against the simulator by
    benchmarks/encdec_checks.py); tracing them took minutes on a cold t5-large plan and replaced that formula."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, out, _ = run_main(["plan", "--model", _model_dir(tmp_path, T5), "--gpus", "1xH100", "--seq-len", "64",
                             "--json"], capsys)
    assert code == 0
    notes = json.loads(out)["assumptions"]
    assert not any("traced" in n or "no activation formula" in n for n in notes)
    assert any(n.startswith("encoder-decoder (T5)") for n in notes)
    assert not (tmp_path / "cache" / "dp-advisor" / "profiles").exists()


GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=64, n_layer=2, n_head=4, vocab_size=512,
            n_positions=256)


def test_transformers_own_warnings_stay_out_of_the_progress(tmp_path, monkeypatch, capsys):
    """GPT-2 with LoRA is traced; building and stepping GPT2LMHeadModel makes transformers log "`loss_type=None` was
    set in the config but it is unrecognized", which printed between the two progress lines (a fuzz run's find).
    The tracer silences transformers' log below errors while it runs: the two lines alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, _, err = run_main(["plan", "--model", _model_dir(tmp_path, GPT2), "--gpus", "1xH100", "--lora", "8",
                             "--precision", "fp32", "--seq-len", "64", "--json"], capsys)
    lines = err.strip().splitlines()
    assert code == 0 and len(lines) == 2 and "tracing" in lines[0] and "traced in" in lines[1], err


def test_refused_pins_come_before_the_trace(tmp_path, monkeypatch, capsys):
    """GPT-2 with LoRA and --tp 2: a mesh refuses LoRA; the refusal came after a trace of seconds. Now the pins are
    checked first: one line, no tracing line, nothing cached."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, _, err = run_main(["plan", "--model", _model_dir(tmp_path, GPT2), "--gpus", "8xH100", "--lora", "8",
                             "--tp", "2"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "tensor/context-parallel plans are for full fine-tuning" in lines[0], err
    assert not (tmp_path / "cache" / "dp-advisor" / "profiles").exists()
