"""Task heads on a decoder: sequence classification, token classification and extractive question
answering, each in place of the causal-LM head (a vocabulary's logits and their cross-entropy).

What belongs here: the head facts (``profiles/task_heads.json``, from transformers' ``Generic*``
head classes and their losses, cited there), which head a config's ``architectures`` names, and
the spec of a model with a task head: the head's weights (``num_labels x hidden``, ``2 x hidden``
for question answering, with a bias where the class has one) replace an untied ``lm_head``, and a
tied one is simply gone (the input embedding stays). What does not: the loss's memory
(``advisor.estimate.activations_loss.head_loss_bytes``), PEFT's ``modules_to_save``
(``advisor.model.lora``), building the head class (``advisor.simulate.heads``).

The head classes exist for the Llama-like decoders (transformers' ``LlamaForSequenceClassification``
and the like subclass ``modeling_layers.GenericFor*``): a task is modelled for the families the
``decoder`` formula counts, or a config whose ``architectures`` already names the head class
(counted on the meta device). No torch.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from advisor.frozen import validated_copy
from advisor.model.config_keys import MAX_NUM_LABELS
from profiles import PROFILES_DIR

if TYPE_CHECKING:  # pragma: no cover
    from advisor.model.spec import ModelSpec
    from advisor.training import TrainingConfig

CAUSAL_LM = "causal-lm"
Task = Literal["sequence-classification", "token-classification", "question-answering"]
DEFAULT_NUM_LABELS = 2  # transformers PretrainedConfig: id2label of two labels unless the config says
ENCODER_CLASS_SUFFIXES = ("ForMaskedLM", "ForPreTraining", "Model")  # BertForMaskedLM, BertModel: the family prefix


class EncoderHead(BaseModel):
    """How an encoder family's head class differs from the decoders' (``HeadRow.encoders``): BERT's."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    module: str = Field(description="The head's linear layer (classifier, qa_outputs).")
    bias: bool = Field(description="The linear layer has a bias.")
    pooler: bool = Field(description="The base model keeps its pooler (dense hidden x hidden and tanh over the "
                                     "first token), which the head reads; the loss reads one row a sequence.")
    dropout: bool = Field(description="Dropout on the last hidden state of every token before the head.")
    base_prefix: str = Field(description="The base model's attribute (base_model_prefix): bert.")


class HeadRow(BaseModel):
    """One row of ``profiles/task_heads.json``: what a head class holds and what its loss keeps (its
    schema is built when the table first loads: a causal-LM plan never reads it)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    class_suffix: str = Field(description="Head class name after the family prefix (Qwen2ForSequenceClassification).")
    module: str = Field(description="The head's linear layer, by its attribute name (score, qa_outputs).")
    width: Literal["num_labels"] | int = Field(description="Output features: the label count, or a fixed width.")
    bias: bool = Field(description="The linear layer has a bias.")
    pooled: bool = Field(description="The loss reads one position per sequence (the last non-pad token).")
    logits_fp32: bool = Field(description="The loss upcasts the logits to fp32 (logits.float()).")
    dropout: bool = Field(description="Dropout on the last hidden state before the head (saves a bool mask).")
    peft_modules_to_save: tuple[str, ...] = Field(description="What PEFT's task model adds to modules_to_save.")
    model_types: tuple[str, ...] = Field(description="The decoder families transformers defines this head class for.")
    base_prefix: str = Field(description="The base model's attribute (base_model_prefix): model.")
    base_prefix_by_model_type: dict[str, str] = Field(description="Families whose class keeps another prefix.")
    encoders: dict[str, EncoderHead] = Field(default={}, description="Encoder families (BERT) with this head "
                                             "class, and how theirs differs, by model_type.")


class TaskHead(BaseModel):
    """The task head a model carries (``ModelSpec.head``): None there means the causal-LM head."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: Task = Field(description="The task the head is for.")
    num_labels: int = Field(ge=1, description="Labels (question answering: 2, start and end).")
    out_features: int = Field(ge=1, description="The head's output width.")
    module: str = Field(description="The head's linear layer (PEFT's modules_to_save name).")
    bias: bool = Field(description="The head's linear layer has a bias.")
    pooled: bool = Field(description="The loss reads the last non-pad token of each sequence only.")
    logits_fp32: bool = Field(description="The loss upcasts the logits to fp32.")
    dropout: bool = Field(description="Dropout before the head (token classification).")
    base_prefix: str = Field(default="model", description="The base model's attribute in the head class "
                             "(module names: model.embed_tokens, or transformer.embed_tokens).")
    saved_copy: bool = Field(default=False, description="PEFT trains a copy of it (LoRA's modules_to_save), so "
                             "its input is kept for its weight gradient over a frozen base.")


@functools.cache
def load_task_heads() -> dict[str, HeadRow]:
    raw = json.loads((PROFILES_DIR / "task_heads.json").read_text())["heads"]
    if list(raw) != list(get_args(Task)):
        raise ValueError(f"profiles/task_heads.json: one row per task head {get_args(Task)}, got {list(raw)}")
    return {task: HeadRow(**row) for task, row in raw.items()}


def task_names() -> tuple[str, ...]:
    """Every ``--task`` choice, the causal-LM head first (the table's rows, ``load_task_heads``, are the
    ``Task`` names in this order; read without loading the table: the CLI's --help text calls it)."""
    return (CAUSAL_LM, *get_args(Task))


def task_of_architecture(architecture: str | None) -> str | None:
    """The task whose head class ``architecture`` names (``Qwen2ForTokenClassification``), or None."""
    if not architecture or architecture.endswith("ForCausalLM"):  # no head class: the table is not loaded
        return None
    for task, row in load_task_heads().items():
        if architecture and architecture.endswith(row.class_suffix):
            return task
    return None


def head_class(architecture: str | None, task: str) -> str:
    """The family's head class for ``task`` from its causal-LM class (``LlamaForCausalLM`` ->
    ``LlamaForSequenceClassification``). ValueError when the architecture is not a causal LM's."""
    row = load_task_heads()[task]
    if architecture and architecture.endswith(row.class_suffix):
        return architecture
    for suffix in ("ForCausalLM", *ENCODER_CLASS_SUFFIXES):
        if architecture and architecture.endswith(suffix):
            return architecture[: -len(suffix)] + row.class_suffix
    named = f"not {architecture}" if architecture else "and this config names no architectures"
    raise ValueError(f"--task {task} needs a causal-LM config (architectures ...ForCausalLM), or BERT's "
                     f"(...ForMaskedLM), {named}")


def config_num_labels(config: dict | None) -> int | None:
    """The label count a config states (``id2label``, else ``num_labels``), or None."""
    if not config:
        return None
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    count = config.get("num_labels")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def resolve_head(task: str | None, num_labels: int | None, *, architecture: str | None,
                 config: dict | None) -> TaskHead | None:
    """The head ``--task`` / ``--num-labels`` ask for, or the one the config's ``architectures``
    names; None for the causal-LM head. ValueError for an unknown task, a label count below 1, a
    label count where the task takes none, or a task the config's head class contradicts."""
    named = task_of_architecture(architecture)
    if task is not None and task != CAUSAL_LM and task not in load_task_heads():
        raise ValueError(f"unknown --task '{str(task)[:40]}'; one of: {', '.join(task_names())}")
    if task is not None and named is not None and task != named:
        raise ValueError(f"--task {task}: the config's architectures names {architecture} ({named}); leave --task out")
    chosen = named if task in (None, CAUSAL_LM) and named is not None else task
    if chosen in (None, CAUSAL_LM):
        if num_labels is not None:
            raise ValueError("--num-labels needs --task sequence-classification or token-classification")
        return None
    row = load_task_heads()[chosen]
    if num_labels is not None and (isinstance(num_labels, bool) or not isinstance(num_labels, int)):
        raise ValueError(f"--num-labels: expected a whole number, got {num_labels!r}"[:100])
    if num_labels is not None and num_labels > MAX_NUM_LABELS:
        raise ValueError(f"--num-labels {num_labels:,}: at most {MAX_NUM_LABELS:,} (a classification head, not a "
                         "vocabulary)")
    if num_labels is not None and num_labels < 1:
        raise ValueError(f"--num-labels must be at least 1 (got {num_labels})")
    if num_labels is not None and row.width != "num_labels":
        raise ValueError(f"--num-labels does not apply to --task {chosen} (its head has {row.width} outputs)")
    stated = config_num_labels(config) if named is not None else None
    if num_labels is not None and stated is not None and num_labels != stated:
        raise ValueError(f"--num-labels {num_labels}: the config's {architecture} has {stated} labels; leave "
                         "--num-labels out")
    labels = num_labels or stated or DEFAULT_NUM_LABELS
    width = labels if row.width == "num_labels" else row.width
    return TaskHead(task=chosen, num_labels=labels if row.width == "num_labels" else width, out_features=width,
                    module=row.module, bias=row.bias, pooled=row.pooled, logits_fp32=row.logits_fp32,
                    dropout=row.dropout)


def head_params(head: TaskHead, hidden_size: int) -> int:
    """The head's parameters: ``out x hidden`` weights and ``out`` biases where it has them."""
    return head.out_features * hidden_size + (head.out_features if head.bias else 0)


def with_head(spec: "ModelSpec", head: TaskHead) -> "ModelSpec":
    """``spec`` with ``head`` in place of its causal-LM head. Counted by formula (the causal LM's
    components): the untied ``lm_head`` (``vocab x hidden``) leaves, the head's weights come, a tied
    embedding stays the input embedding. Counted on the meta device from the head class itself: the
    counts are already the head model's; the head moves from 'other' to the head component."""
    if spec.hidden_size is None or spec.head_params is None or spec.other_params is None:
        raise ValueError(f"--task {head.task} needs the model's shape and components; {spec.name[:60]} has none")
    size = head_params(head, spec.hidden_size)
    row = load_task_heads()[head.task]
    head = validated_copy(head, {"base_prefix": row.base_prefix_by_model_type.get(spec.model_type, row.base_prefix)})
    if task_of_architecture(spec.architecture) == head.task:  # the meta device (or a live model) built the head class
        if spec.other_params + spec.head_params < size:
            raise ValueError(f"{spec.architecture}: its parameters outside the blocks hold no {head.module} head")
        update = {"head_params": size, "other_params": spec.other_params + spec.head_params - size,
                  "tied_embeddings": False}
        return validated_copy(spec, {**update, "head": head})
    encoder = row.encoders.get(spec.model_type or "")
    if spec.model_type not in row.model_types and encoder is None:
        raise ValueError(f"--task {head.task} is modelled for the Llama-like decoders transformers defines a "
                         f"...{row.class_suffix} for ({', '.join(row.model_types)}) and for "
                         f"{', '.join(row.encoders)}; {spec.name[:60]} is {spec.model_type or 'a size only'}")
    assert spec.trainable_params == spec.total_params, "a task head goes on the whole model, before LoRA"
    other = spec.other_params
    if encoder is not None:  # BERT's: a biased linear layer, after the pooler (sequence classification)
        head = validated_copy(head, {"module": encoder.module, "bias": encoder.bias, "pooled": encoder.pooler,
                                     "dropout": encoder.dropout, "base_prefix": encoder.base_prefix})
        size = head_params(head, spec.hidden_size)
        other += spec.hidden_size * spec.hidden_size + spec.hidden_size if encoder.pooler else 0
    total = spec.total_params - spec.head_params - spec.other_params + other + size
    return validated_copy(spec, {
        "architecture": head_class(spec.architecture, head.task), "head_params": size, "tied_embeddings": False,
        "other_params": other, "total_params": total, "trainable_params": total, "head": head})


def head_note(spec: "ModelSpec", head: TaskHead, *, vocab_head: int, named_by: str | None) -> str:
    """The plan's assumption line for a task head (``named_by``: what named it when --task did not)."""
    what = {"sequence-classification": f"{head.num_labels} labels, logits of every token, the last non-pad "
                                       "token's gathered for a cross-entropy over the batch",
            "token-classification": f"{head.num_labels} labels per token (dropout before the head, fp32 "
                                    "cross-entropy over every token)",
            "question-answering": "start and end logits over the sequence, a cross-entropy for each"}[head.task]
    encoder = load_task_heads()[head.task].encoders.get(spec.model_type or "")
    if head.task == "sequence-classification" and encoder:
        what = f"{head.num_labels} labels over the pooler's output (the first token), a cross-entropy over the batch"
    why = named_by or f"--task {head.task}"
    gone = f"the untied lm_head ({vocab_head / 1e6:,.1f}M) is gone" if vocab_head else \
        "the tied embedding stays the input embedding"
    if vocab_head and encoder:
        gone = (f"the masked-LM head ({vocab_head / 1e6:,.1f}M: its transform and bias; the decoder is the tied "
                "embedding, which stays the input embedding) is gone")
    return (f"task head ({why}): {spec.architecture}, {head.module} = Linear({spec.hidden_size}, {head.out_features}"
            f"{', bias' if head.bias else ''}) in place of the vocabulary head ({what}; no vocabulary logits); {gone}")


def apply_task(spec: "ModelSpec", config: dict | None, training: "TrainingConfig", *, task: str | None,
               num_labels: int | None, notes: list[str]) -> tuple["ModelSpec", "TrainingConfig"]:
    """The spec with the task head asked for or named by the config (or a live model's class), and its
    assumption line in ``notes``; a LoRA without ``modules_to_save`` saves the head, as PEFT's task models do
    (``PeftModelForSequenceClassification``). Unchanged for the causal LM."""
    head = resolve_head(task, num_labels, architecture=spec.architecture, config=config)
    if head is None:
        return spec, training
    if training.loss != "hf":
        raise ValueError(f"--loss {training.loss} is a causal-LM loss kernel; a {head.task} head has no vocabulary")
    vocab_head = 0 if task_of_architecture(spec.architecture) == head.task else (spec.head_params or 0)
    spec = with_head(spec, head)
    named_by = None if task not in (None, CAUSAL_LM) else \
        "the model's class" if spec.source == "module" else "the config's architectures"
    notes.append(head_note(spec, spec.head, vocab_head=vocab_head, named_by=named_by))
    if training.lora is not None and training.lora.modules_to_save is None:
        saved = validated_copy(training.lora, {"modules_to_save": (spec.head.module,)})
        training = validated_copy(training, {"lora": saved})
    return spec, training
