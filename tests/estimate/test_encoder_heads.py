"""BERT's task heads (``advisor.model.heads``, the ``encoders`` rows of profiles/task_heads.json) against the
simulated step: bert-large-uncased's shapes at 2 blocks, BertForSequenceClassification, batch 4 of 512 tokens,
eager attention with its 0.1 attention dropout (the Trainer's recipe, one GPU). The eager blocks keep the
softmax output, the dropout's bool mask and the dropped-out probabilities a score (the simulator zeroed attention
dropout under eager attention too until it was checked here: its fp32 step read 11.9% below the estimate, which
counts what a GPU's eager attention keeps)."""

from __future__ import annotations

import pytest

from advisor.estimate.memory import estimate_memory
from advisor.hardware.cluster import parse_gpus
from advisor.model.bundled import load_bundled_config
from advisor.model.heads import resolve_head, with_head
from advisor.model.sources import spec_from_config
from advisor.simulate.heads import head_config
from advisor.simulate.step import simulate
from advisor.strategies import get_strategy
from advisor.training import TrainingConfig


@pytest.mark.parametrize(("precision", "micro", "checkpointing", "within"), [
    ("fp32", 4, False, 0.015), ("fp32", 1, True, 0.015), ("fp16-mixed", 4, False, 0.03)])
def test_bert_sequence_classification_against_the_simulated_step(precision, micro, checkpointing, within):
    """Eager: fp32, 1,357,058,284 simulated bytes at batch 4 without checkpointing (the estimate +0.9%, both at a
    block's backward), 930,541,780 at batch 1 checkpointed (-0.2%, the optimizer step). fp16-mixed at batch 4,
    1,292,046,572: the top block's softmax backward decides (the dropped-out probabilities' fp32 gradient, CUDA's
    ``grad * output`` product and the scores' gradient beside the fp32 softmax output and q and k,
    ``activations_blocks.encoder_eager_remaining_per_token``): -2.4%, where the block's MLP backward alone read
    -7.6% and -3.1% before each of the query, key and value linears' own autocast copy of the block's input was
    counted; the rest does not grow with the blocks (24 blocks on an H200: -0.9%, tests/test_gpu_stacks.py)."""
    config = {**load_bundled_config("google-bert/bert-large-uncased"), "num_hidden_layers": 2,
              "_name_or_path": "bert-large-2"}
    spec = with_head(spec_from_config(config, name="bert-large-2", source="local"),
                     resolve_head("sequence-classification", None, architecture="BertForMaskedLM", config=None))
    training = TrainingConfig(seq_len=512, precision=precision, attention="eager", recipe="trainer")
    sim = simulate(head_config(config, spec.head), world_size=1, strategy="ddp", training=training,
                   micro_batch_size=micro, checkpointing=checkpointing)
    assert sim.total_params == spec.total_params
    est = estimate_memory(spec, parse_gpus("1xV100"), training, get_strategy("ddp").on("torch"),
                          micro_batch_size=micro, checkpointing=checkpointing)
    assert abs(est.peak_allocated / sim.peak_allocated - 1) < within, (est.peak_allocated, sim.peak_allocated)


@pytest.mark.parametrize(("precision", "attention", "lora", "checkpointing"), [
    ("fp32", "eager", dict(rank=16), False), ("bf16-mixed", "sdpa", dict(rank=16), False),
    ("fp16-mixed", "eager", dict(rank=16, dropout=0.1), False),
    ("fp16-mixed", "eager", dict(rank=8, targets=("query", "key", "value")), False),
    ("fp16-mixed", "eager", dict(rank=16), True)])
def test_bert_lora_against_the_simulated_step(precision, attention, lora, checkpointing):
    """LoRA over BERT's fp32 base (``activations_blocks.frozen_encoder_layer_per_token``), 3 blocks of width 256,
    batch 4 of 512 tokens: measured +0.62% (fp32), -2.14% (bf16-mixed, SDPA), +0.83% (adapter dropout), -0.15%
    (query, key and value), +2.10% (checkpointed) of the simulated step. Counted as a full fine-tune's blocks, as
    before, the fp16 eager case read +7.8% (a block's step one-third over: 56,348,160 bytes against 49,165,328)."""
    from advisor.model.lora import LoraConfig, with_lora

    config = {**load_bundled_config("google-bert/bert-large-uncased"), "num_hidden_layers": 3, "hidden_size": 256,
              "intermediate_size": 1024, "num_attention_heads": 4, "_name_or_path": "bert-3"}
    base = with_head(spec_from_config(config, name="bert-3", source="local"),
                     resolve_head("sequence-classification", 2, architecture="BertForMaskedLM", config=None))
    adapters = LoraConfig(**lora)
    training = TrainingConfig(seq_len=512, precision=precision, attention=attention, recipe="trainer", lora=adapters,
                              frozen_base="param")
    sim = simulate(head_config(config, base.head), world_size=1, strategy="ddp", training=training, micro_batch_size=4,
                   checkpointing=checkpointing)
    spec = with_lora(base, adapters)
    assert sim.trainable_params == spec.trainable_params
    est = estimate_memory(spec, parse_gpus("1xH100"), training, get_strategy("ddp").on("torch"), micro_batch_size=4,
                          checkpointing=checkpointing)
    assert abs(est.peak_allocated / sim.peak_allocated - 1) < 0.025, (est.peak_allocated, sim.peak_allocated)
