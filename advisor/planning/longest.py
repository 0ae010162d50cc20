"""``--seq-len max``: the longest sequence each strategy fits at micro-batch 1.

Memory grows with the sequence length at every moment of the step (activations, logits, loss), so
whether a candidate fits is monotone in it and a binary search over the lengths the training config
accepts finds the longest (about 22 evaluations of the analytic model per strategy). Checkpointing
follows the training config (``auto``: whichever fits). The model's own context
(``max_position_embeddings``) is not a cap: the plan notes when a length exceeds it.
"""

from __future__ import annotations

from advisor.hardware.cluster import Hardware
from advisor.model.spec import ModelSpec
from advisor.planning.planner import evaluate_candidate
from advisor.training import MAX_SEQ_LEN, TrainingConfig


def longest_seq_len(spec: ModelSpec, hw: Hardware, training: TrainingConfig, strategy: str) -> int | None:
    """The longest ``seq_len`` at which ``strategy`` fits ``training``'s micro-batch (default one sample) per
    GPU; None if not even one token."""
    micro_batch_size = training.micro_batch_size or 1

    def fits(length: int) -> bool:
        at = training.model_copy(update={"seq_len": length, "micro_batch_size": micro_batch_size,
                                         "global_batch_size": None})
        return evaluate_candidate(spec, hw, at, strategy).fits

    if not fits(1):
        return None
    low, high = 1, MAX_SEQ_LEN  # fits(low); search the last length that fits
    if fits(high):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
