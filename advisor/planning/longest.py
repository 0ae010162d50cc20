"""``--seq-len max``: the longest sequence each strategy fits at micro-batch 1 (with --global-batch, at that batch).

Memory grows with the sequence length at every moment of the step (activations, logits, loss), so
whether a candidate fits is monotone in it and a binary search over the lengths the training config
accepts finds the longest (about 22 evaluations of the analytic model per strategy). Checkpointing
follows the training config (``auto``: whichever fits). The model's own context
(``max_position_embeddings``) is not a cap: the plan notes when a length exceeds it.

A family with no activation formula is traced at one length at a time (``advisor.planning.api``):
``longest_traced`` searches with the Llama-like estimate, traces the length found, searches again
with that profile scaled by tokens (``advisor.estimate.traced``), and repeats at each new length
until the search returns the length it last traced, where the traced profile itself decides.

Meshes (``longest_on_meshes``): context parallelism splits each sequence over its ranks and tensor
parallelism splits the blocks, so a mesh can hold a sequence no data-parallel strategy can. Each mesh
the planner would consider is searched the same way, over lengths its ring attention can split
(multiples of 2 x cp: each rank holds two chunks, the load-balanced layout). Under pinned degrees (--tp,
--cp, --hybrid; --pp and --ep, whose pipeline and expert meshes are searched instead) the plan is one of
the pinned meshes, so the length is the longest one of those holds, whatever data parallelism alone holds.

The plan is shown at the longest length a candidate holds on the GPUs alone (``planned_length``): CPU
offload reaches further only by moving the states over PCIe, and the plan never offloads while a
GPU-only candidate fits. Where an offloading strategy holds more, the plan says how much more and at
what speed (``reasons.LongerWithOffload``); offload is planned only when no GPU-only candidate holds a
single token.
"""

from __future__ import annotations

from collections.abc import Callable

from advisor.frozen import validated_copy
from advisor.hardware.cluster import Hardware
from advisor.mesh import ParallelDims
from advisor.model.spec import ModelSpec
from advisor.planning import reasons as r
from advisor.planning.candidates import batch_split_problem, evaluate_candidate, within_headroom
from advisor.strategies import get_strategy
from advisor.training import MAX_SEQ_LEN, TrainingConfig


def _at_length(training: TrainingConfig, length: int) -> TrainingConfig:
    """``training`` at ``length`` tokens and the micro-batch asked for (one sample when none was), no global batch:
    what every length search here evaluates. With --global-batch, that batch, split as the planner's micro-batch
    search splits it (accumulation holds memory: a length one sample holds, the batch may not)."""
    if training.global_batch_size is not None:
        return validated_copy(training, {"seq_len": length})
    return validated_copy(training, {"seq_len": length, "micro_batch_size": training.micro_batch_size or 1,
                                     "global_batch_size": None})


def longest_seq_len(spec: ModelSpec, hw: Hardware, training: TrainingConfig, strategy: str) -> int | None:
    """The longest ``seq_len`` at which ``strategy`` fits ``training``'s micro-batch (default one sample) per
    GPU, or its --global-batch; None if not even one token (or the GPUs cannot split that batch)."""
    if batch_split_problem(training, hw.world_size) is not None:
        return None
    return _search(lambda length: evaluate_candidate(spec, hw, _at_length(training, length), strategy).fits, step=1)


def longest_all(spec: ModelSpec, hw: Hardware, training: TrainingConfig,
                names: list[str]) -> tuple[dict[str, int | None], int | None]:
    """Each strategy's longest length, and the one the plan is shown at (``planned_length``; None: not one
    token fits)."""
    longest = {name: longest_seq_len(spec, hw, training, name) for name in names}
    return longest, planned_length(longest, training)


def offloads(key: str, training: TrainingConfig) -> bool:
    """Whether the candidate a ``longest`` key names (a strategy, or ``strategy mesh-label``) rests states on
    the CPU."""
    return get_strategy(key.split(" ", 1)[0]).on(training.engine).offloads


def planned_length(longest: dict[str, int | None], training: TrainingConfig) -> int | None:
    """The length the plan is shown at: the longest any GPU-only candidate holds; the longest of all only
    where no GPU-only candidate holds a token (None: nothing does)."""
    gpu_only = [length for key, length in longest.items() if length and not offloads(key, training)]
    return max(gpu_only, default=None) or max((length for length in longest.values() if length), default=None)


def longer_with_offload(spec: ModelSpec, hw: Hardware, training: TrainingConfig,
                        longest: dict[str, int | None]) -> list[r.LongerWithOffload]:
    """Where an offloading strategy holds more than the length the plan is shown at (``training.seq_len``),
    how much more and how fast it runs there; none past a learned position table (GPT-2, BERT: no longer input
    runs, and the plan is shown at the table's length, not the longest on the GPUs alone)."""
    table = spec.max_position_embeddings if spec.learned_positions else None
    beyond = [(length, key) for key, length in longest.items()
              if length and length > training.seq_len and offloads(key, training) and (table is None or length <= table)]
    if not beyond or not any(length for key, length in longest.items() if not offloads(key, training)):
        return []  # nothing longer, or the plan itself offloads (no GPU-only candidate holds a token)
    length, key = max(beyond)
    step = evaluate_candidate(spec, hw, _at_length(training, length), key.split(" ", 1)[0]).step_time
    if step is None:
        return []
    return [r.LongerWithOffload(strategy=key, seq_len=length, gpu_only_seq_len=training.seq_len,
                                step_s=step.step_s, tokens_per_s=step.tokens_per_s)]


def within_headroom_at(spec: ModelSpec, hw: Hardware, training: TrainingConfig, strategy: str,
                       length: int, mesh: ParallelDims | None = None) -> r.LongestWithinHeadroom | None:
    """Where the plan's ``strategy`` (on ``mesh``, whose ring attention splits lengths of 2 x cp) holds ``length``
    tokens only past the --headroom (the longest fills the GPU to its last GiB, within the estimate's error of an
    out-of-memory failure): the longest it holds within the headroom. None where the plan is within it already, or
    under --policy fastest (no headroom policy)."""
    def roomy(tokens: int) -> bool:
        at = _at_length(training, tokens)
        cand = evaluate_candidate(spec, hw, at, strategy, mesh)
        return cand.fits and within_headroom(cand, at)

    if training.policy == "fastest" or roomy(length):
        return None
    found = _search(roomy, step=2 * mesh.cp if mesh is not None else 1)
    if found is None:
        return None
    return r.LongestWithinHeadroom(strategy=strategy if mesh is None else f"{strategy} on mesh {mesh.label}",
                                   seq_len=found, longest_seq_len=length,
                                   headroom=training.headroom)


LONGER_WITH = 1.05  # a change whose longest is not 5% longer than the plan's gets no line


def longer_with_change(spec: ModelSpec, hw: Hardware, training: TrainingConfig, strategy: str, length: int,
                       mesh: ParallelDims | None = None) -> r.LongerWithChange | None:
    """``--seq-len max``: the longest the plan's ``strategy`` (on ``mesh``) holds with one change that keeps the
    mathematics and frees memory beside a long sequence: the fused loss kernel in place of transformers' full
    logits (``--loss hf``: at 32k tokens of a 128k vocabulary they are most of a GPU), and the fused optimizer step
    where the plan's holds a state-sized temporary. The longer of the two where it holds ``LONGER_WITH`` times the
    plan's ``length`` or more; None otherwise, and for a learned position table (GPT-2, BERT: no longer input runs).
    Searched upward from ``length``, which the plan holds."""
    if spec.learned_positions:
        return None
    from advisor.estimate.activations import shape_of
    from advisor.planning.remedies import optimizer_impl_changes

    changes = [(change.name, change.update) for change in optimizer_impl_changes(training)]
    if training.loss == "hf" and shape_of(spec).vocab_size and not spec.loss_kernel_refusal:
        changes.append(("--loss fused", {"loss": "fused"}))
    step = 2 * mesh.cp if mesh is not None else 1
    found = []
    for name, update in changes:
        try:
            changed = validated_copy(training, update)
        except ValueError:  # a change the user's other settings refuse
            continue

        def fits(tokens: int) -> bool:
            return evaluate_candidate(spec, hw, _at_length(changed, tokens), strategy, mesh).fits

        low, high = length // step, MAX_SEQ_LEN // step
        if not fits(low * step):
            continue
        if fits(high * step):
            low = high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle * step) else (low, middle)
        found.append((low * step, name))
    if not found or max(found)[0] < LONGER_WITH * length:
        return None
    longer, name = max(found)
    label = strategy if mesh is None else f"{strategy} on mesh {mesh.label}"
    return r.LongerWithChange(strategy=label, change=name, seq_len=longer, plan_seq_len=length)


def longest_traced(spec: ModelSpec, hw: Hardware, training: TrainingConfig, names: list[str], *,
                   retrace: Callable[[ModelSpec, int], ModelSpec],
                   max_traces: int = 6) -> tuple[ModelSpec, dict[str, int | None], int | None]:
    """``longest_all`` for a traced family: ``retrace(spec, length)`` returns the spec with profiles traced
    at ``length`` added (the same spec when tracing fails); see the module docstring."""
    longest, best = longest_all(spec, hw, training, names)
    for _ in range(max_traces):
        if best is None:
            break
        traced = retrace(spec, best)
        if traced is spec:  # tracing failed (the plan notes it): the Llama-like search stands
            break
        spec = traced
        longest, found = longest_all(spec, hw, training, names)
        if found == best:  # the profile traced at this length fits it, and one token more does not
            break
        best = found
    return spec, longest, best


def _search(fits: Callable[[int], bool], *, step: int) -> int | None:
    """The largest multiple of ``step`` up to MAX_SEQ_LEN for which ``fits`` (monotone) holds; None if none."""
    low, high = 1, MAX_SEQ_LEN // step
    if not fits(low * step):
        return None
    if fits(high * step):
        return high * step
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle * step) else (low, middle)
    return low * step


def longest_key(strategy: str, mesh: ParallelDims | None) -> str:
    """How a candidate is keyed in the plan's ``longest_seq_len``: its strategy, and on a mesh its label too."""
    return strategy if mesh is None else f"{strategy} {mesh.label}"


def longest_on_mesh(spec: ModelSpec, hw: Hardware, training: TrainingConfig, strategy: str,
                    mesh: ParallelDims) -> int | None:
    """The longest ``seq_len`` at which ``strategy`` fits the micro-batch asked for (one sample when none was)
    per data-parallel rank on ``mesh``."""
    return _search(lambda length: evaluate_candidate(spec, hw, _at_length(training, length), strategy, mesh).fits,
                   step=2 * mesh.cp)


def longest_on_meshes(spec: ModelSpec, hw: Hardware, training: TrainingConfig, strategy: str,
                      meshes: Callable[[TrainingConfig], list[ParallelDims]]) -> dict[str, int | None]:
    """Per mesh (keyed ``strategy mesh-label``, as the plan labels its candidates), its longest length.
    ``meshes(training)`` lists the meshes the planner would consider; they are listed at a length every
    context-parallel degree of the node divides (the planner keeps a degree only where it divides)."""
    probe = validated_copy(training, {"seq_len": 2 * (1 << (hw.gpus_per_node - 1).bit_length())})
    return {longest_key(strategy, mesh): longest_on_mesh(spec, hw, training, strategy, mesh) for mesh in meshes(probe)
            if batch_split_problem(training, mesh.dp) is None}  # a mesh keeps --global-batch or is not a candidate
