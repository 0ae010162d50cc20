"""How a model's parameters split into FSDP's units: its repeated blocks (each its own unit, as
``wrappers.fsdp.apply_fsdp`` shards them) and the root (everything else: embeddings, position tables,
final norms, the head). Read by the strategy buffers (``advisor.estimate.strategy_buffers``), FSDP1's
(``fsdp1_buffers``), a quantised base's and the TP rank's spec. Pure: no torch import.

The blocks are counted as ``num_blocks`` copies of the largest one, less ``blocks_saving``: an MoE model's
dense layers (``ModelSpec.dense_layer_saving``), Jamba's smaller blocks, an encoder-decoder's encoder blocks,
which lack the decoder block's cross-attention (T5, BART: ``EncDecFacts``)."""

from __future__ import annotations

from advisor.estimate.activations import shape_of
from advisor.model.spec import ModelSpec


def _encdec_blocks(spec: ModelSpec) -> tuple[int, int, int] | None:
    """(largest block, number of blocks, parameters in all blocks) of an encoder-decoder whose stacks are
    counted (``EncDecFacts``), None otherwise. Its root holds the shared embedding once (T5 and BART tie
    both stacks' token embeddings and the head), the position tables and norms; measured on the simulated
    FSDP2 step: the root's unsharded parameters and the last decoder block's all-gather output
    (tests/estimate/test_encdec_fsdp_units.py)."""
    facts = spec.encdec
    if spec.layer_params is not None or facts is None or not (facts.encoder_params and facts.decoder_params):
        return None
    # A frozen base (LoRA) keeps the older even split for now: its adapters are counted in other_params, not by
    # stack, and its block backward (under FSDP2 at the bottom decoder block, an encoder block prefetched) leans
    # on it (tests/estimate/test_encdec_lora_zero3.py; benchmarks/results/encdec_checks.md).
    if spec.trainable_params < spec.total_params:
        return None
    n_enc, n_dec = facts.num_encoder_layers, facts.num_decoder_layers
    largest = max(-(-facts.encoder_params // n_enc), -(-facts.decoder_params // n_dec))
    return largest, n_enc + n_dec, facts.encoder_params + facts.decoder_params


def block_params(spec: ModelSpec) -> tuple[int, int, int]:
    """(the largest block, number of blocks, everything outside the blocks)."""
    if spec.layer_params is not None and spec.num_layers:
        # MoE models with dense layers (DeepSeek): those hold less than the MoE block counted here.
        inside = spec.layer_params * spec.num_layers - spec.dense_layer_saving
        return spec.layer_params, spec.num_layers, spec.total_params - inside
    encdec = _encdec_blocks(spec)
    if encdec is not None:
        largest, blocks, inside = encdec
        return largest, blocks, spec.total_params - inside
    shape = shape_of(spec)
    outside = 2 * shape.vocab_size * shape.hidden_size
    layers = shape.num_layers
    return max(1, (spec.total_params - outside) // layers), layers, outside


def blocks_saving(spec: ModelSpec) -> int:
    """How many fewer parameters the blocks hold than ``num_blocks`` copies of the largest (``block_params``):
    ``layer * n_layers - blocks_saving(spec)`` is every block's parameters."""
    encdec = _encdec_blocks(spec)
    if encdec is not None:
        largest, blocks, inside = encdec
        return largest * blocks - inside
    return spec.dense_layer_saving
