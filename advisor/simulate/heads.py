"""The simulator's side of task heads (``advisor.model.heads``): the config that builds the head class
(transformers' ``Qwen2ForSequenceClassification`` and the like, from their causal LM's config) and the
targets its loss reads, shaped for the task. Imports torch only inside ``task_targets``.
"""

from __future__ import annotations

from typing import Any

from advisor.model.heads import TaskHead, head_class, task_of_architecture


def head_config(cfg: dict, head: TaskHead) -> dict:
    """``cfg`` (a causal LM's config.json) naming the head class, with the head's label count and a pad
    token: transformers' sequence classifier finds the last non-pad token of each row and refuses a batch
    above one without a ``pad_token_id`` (``GenericForSequenceClassification.forward``)."""
    archs = cfg.get("architectures") or [None]
    out = {**cfg, "architectures": [head_class(archs[0], head.task)], "num_labels": head.num_labels}
    out.pop("id2label", None), out.pop("label2id", None)
    # The head classes build their base with AutoModel.from_config(config), which honours the config's
    # dtype (a bf16 checkpoint's base in bf16), where the causal LM's class built directly does not: drop
    # it, so both are built as the simulator's causal LMs are (fp32 master weights, cast by the recipe).
    out.pop("torch_dtype", None), out.pop("dtype", None)
    if out.get("pad_token_id") is None:
        eos = out.get("eos_token_id")
        out["pad_token_id"] = eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else 0
    return out


def task_targets(net: Any, ids: Any, labels: Any) -> Any:
    """What the forward takes beside ``input_ids`` for ``net``'s loss: ``labels`` unchanged for a causal LM
    (or an encoder-decoder); for a head class (by its class name) a dict of keyword arguments: one label per
    row (sequence classification; a float for a single-label regression), one per token (token
    classification), a start and an end position per row (question answering)."""
    import torch

    task = task_of_architecture(type(net).__name__)
    if task is None:
        return labels
    batch, seq = ids.shape
    labels_count = getattr(net.config, "num_labels", 2)
    if task == "question-answering":
        return {"start_positions": torch.randint(0, seq, (batch,)), "end_positions": torch.randint(0, seq, (batch,))}
    if task == "token-classification":
        return {"labels": torch.randint(0, labels_count, (batch, seq))}
    if labels_count == 1:
        return {"labels": torch.zeros(batch)}
    return {"labels": torch.randint(0, labels_count, (batch,))}
