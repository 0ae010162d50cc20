"""Bad arguments to the library's ``advisor.plan`` (a helper's fuzz run of about 48,600 calls, 2026-11-28): one
ValueError naming the argument, never an internal error, a raw pydantic dump or a silently changed estimate."""

from __future__ import annotations

import pytest

import advisor
from advisor.cli.main import main
from advisor.hardware.cluster import parse_gpus
from advisor.model.bundled import load_bundled_config
from advisor.planning.smallest import smallest_count


@pytest.mark.parametrize(("options", "names"), [
    # the keyword, then the flag (a review: it gave the flag's spelling alone, 'micro-batch-size', not a flag)
    (dict(tp=0), "tp (--tp):"), (dict(tp=1.5), "tp (--tp):"), (dict(ep=0), "ep (--ep):"),
    (dict(virtual_stages=-1), "virtual_stages (--virtual-stages):"),
    (dict(pp=2, pp_layers="16,16"), "pp_layers (--pp-layers):"), (dict(pp_schedule=5), "pp_schedule (--pp-schedule):"),
    (dict(hybrid=0), "hybrid (--hybrid):"),
    (dict(seq_len="max", micro_batch_size=0), "micro_batch_size (--micro-batch):"),  # was planned at micro-batch 1
    (dict(cache_dir=5), "cache_dir:"), (dict(progress=5), "progress:"),  # were caught as trace failures
    (dict(training={"seq_len": 5}), "training:")])
def test_one_value_error_naming_the_argument(options, names):
    with pytest.raises(ValueError) as err:
        advisor.plan("7B", "2xA100", **options)
    assert str(err.value).startswith(names) and "\n" not in str(err.value)


@pytest.mark.parametrize(("gpus", "options", "names"), [
    (2, {}, "--gpus:"), (b"2xA100", {}, "--gpus:"), ("2xA100", dict(nodes="2"), "--nodes:"),
    ("2xA100", dict(nodes=2.5), "--nodes:"), ("2xA100", dict(interconnect=5), "--interconnect:")])
def test_hardware_arguments_of_another_type(gpus, options, names):
    with pytest.raises(ValueError, match=f"^{names}"):
        advisor.plan("7B", gpus, **options)


def test_a_hardware_and_a_nodes_option_are_not_both_taken():
    with pytest.raises(ValueError, match="a Hardware fixes them"):
        advisor.plan("7B", parse_gpus("2xA100"), nodes=4)


def test_the_largest_cluster_is_planned_not_refused():
    """16,384 nodes of 8 H100s, most of each GPU reserved: no count of them fits, and the plan says so (the search
    for a larger count used to build a 16,385-node Hardware: a ValidationError)."""
    plan = advisor.plan("7B", "16384x8xH100", reserve_gib=77.5)  # 0.4 GiB left beside the CUDA context
    assert plan.recommendation is None
    assert smallest_count(lambda count: False, above=16384 * 8, per_node=8) is None
    assert smallest_count(lambda count: count >= 16384 * 8, above=8, per_node=8) == 16384 * 8  # the last is tried


@pytest.mark.parametrize(("model", "patch", "key"), [
    ("mistralai/Mixtral-8x7B-v0.1", {"num_experts_per_tok": 100}, "num_experts_per_tok"),
    ("meta-llama/Llama-3.1-8B", {"num_key_value_heads": 5}, "num_key_value_heads"),
    ("meta-llama/Llama-3.1-8B", {"num_key_value_heads": 64}, "num_key_value_heads")])
def test_configs_whose_counts_cannot_go_together(model, patch, key):
    """Top-100 of 8 experts gave 565B active parameters of a 46.7B model; 5 key-value heads for 32 queries planned."""
    with pytest.raises(ValueError, match=f'"{key}" is'):
        advisor.resolve_model({**load_bundled_config(model), **patch})


def test_margin_low_says_the_end_that_decided(capsys):
    """The recommendation's figures are the end of the range that --margin judges, the expected total beside it:
    'fits: 41.59 of 39.38 GiB (106%)' read as a contradiction."""
    try:
        main(["plan", "-m", "1.5B", "-g", "1xA100-40GB-PCIE", "--margin", "low"])
    except SystemExit as done:
        assert done.code in (0, None)
    out = " ".join(capsys.readouterr().out.split())
    # the sentence against the plan's own --json: its low end (which fits the 39.38 GiB card) and its expected total
    chosen = advisor.plan("1.5B", "1xA100-40GB-PCIE", margin="low").chosen
    low, total = chosen.memory_range.low / 2**30, chosen.memory_bytes.total / 2**30
    assert low <= 39.38 < total
    assert f"{low:.2f} of 39.38 GiB per GPU at the low end of its range ({low / 39.38:.0%}; expected {total:.2f})" in out


@pytest.mark.parametrize(("options", "names"), [
    (dict(micro_batch_size=0), "micro_batch_size:"), (dict(seq_len=-1), "seq_len:"), (dict(engine="foo"), "engine:"),
    (dict(strategy=5), "strategy:"), (dict(strategy=["zero3"]), "strategy:"), (dict(tp=None), "tp:"),
    (dict(tp="2"), "tp:")])
def test_wrap_names_the_argument(options, names):
    """wrap() on CPU: a micro-batch of 0 was planned at the loader's (or 64), an unknown engine ignored, and the
    rest reached pydantic dumps or TypeErrors."""
    torch = pytest.importorskip("torch")
    from wrappers.wrap import wrap

    with pytest.raises(ValueError, match=f"^{names}"):
        wrap(torch.nn.Sequential(torch.nn.Linear(4, 4)), **options)
    with pytest.raises(ValueError, match="^model:"):
        wrap(5)


@pytest.mark.parametrize(("options", "names"), [
    (dict(strategy=5), "strategy:"), (dict(strategy=["zero3"]), "strategy:"), (dict(strategy=""), "unknown strategy"),
    (dict(trainable_params=-5), "--trainable-params must be at least 1"),
    (dict(trainable_params=True), "--trainable-params:"), (dict(trainable_params=1.5), "--trainable-params:")])
def test_strategy_and_trainable_params_of_another_kind(options, names):
    with pytest.raises(ValueError, match=f"^{names}"):
        advisor.plan("7B", "2xA100", **options)


@pytest.mark.parametrize(("labels", "names"), [(2.5, "--num-labels:"), ("2", "--num-labels:"),
                                               (10**30, "--num-labels 1,000,000,000,000")])
def test_num_labels_of_another_kind(labels, names):
    with pytest.raises(ValueError, match=f"^{names}"):
        advisor.plan("meta-llama/Llama-3.1-8B", "2xA100", task="sequence-classification", num_labels=labels)


def test_asking_a_plan_for_a_strategy_it_did_not_plan():
    plan = advisor.plan("7B", "2xA100", strategy="ddp")
    with pytest.raises(ValueError, match="no 'zero3' candidate"):
        plan.candidate("zero3")


@pytest.mark.parametrize(("model", "said"), [("0B", "must be at least 1"), ("1000.4T", "is more than 1e"),
                                              ("-3B", "expected a number like 7.5B")])
def test_a_size_says_what_is_wrong_with_it(model, said):
    """These read 'not a local path, bundled id, size or Hub id': parse_count's own reason was swallowed."""
    with pytest.raises(ValueError, match=said):
        advisor.resolve_model(model)


def test_lora_with_no_target_names_is_refused():
    """targets=[] silently took PEFT's default targets."""
    with pytest.raises(ValueError, match="no module names"):
        advisor.plan("meta-llama/Llama-3.1-8B", "1xH100", lora={"rank": 8, "targets": []})


def test_checkpointing_true_and_false_read_as_wrap_reads_them():
    """A review: wrap(activation_checkpointing=True) is on, plan(activation_checkpointing=True) was refused."""
    for flag, mode in ((True, "on"), (False, "off")):
        as_bool = advisor.plan("Qwen/Qwen2.5-0.5B", "2xA100", activation_checkpointing=flag)
        as_mode = advisor.plan("Qwen/Qwen2.5-0.5B", "2xA100", activation_checkpointing=mode)
        assert as_bool.training.activation_checkpointing == mode
        assert as_bool.model_dump_json() == as_mode.model_dump_json()
