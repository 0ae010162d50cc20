"""Choose one candidate and explain the choice.

The choice starts from size thresholds (under 1B parameters: ddp; 1-10B: zero3; over 10B: zero3
with CPU offload considered), checks the default against memory, and when it does not fit takes the
fastest GPU-only strategy that fits, on either side of the default (checkpointing and smaller
micro-batches first, within each strategy); offload only when nothing on the GPUs alone fits, along
``strategies.ESCALATION`` from the default. Then it applies the margin policy
(``prefer_practical``: among plans within ``SAME_SPEED`` of that choice's tokens/s, one that leaves
``TrainingConfig.headroom`` of memory free wins, then the one that communicates least; the reason
gives both plans' memory shares and step times), and lists cheaper strategies that also fit
(``advisor.planning.smallest`` finds the fewest GPUs that would fit when nothing does). The candidates
come from ``advisor.planning.candidates``.
"""

from __future__ import annotations

from advisor.model.spec import ModelSpec
from advisor.planning.candidates import Candidate, Recommendation
from advisor.planning.fastest import explain_tradeoff, rank_by_time
from advisor.strategies import ESCALATION, STRATEGIES, StrategyName
from advisor.training import TrainingConfig
from advisor.units import GIB

# Throughputs within 3% count as the same speed: well inside the step-time model's error against
# published runs (benchmarks/results/throughput_validation.md: within 25%), so a smaller gap is no
# reason to give up memory headroom or take on more communication.
SAME_SPEED = 0.03
SMALL_MODEL = 10**9
LARGE_MODEL = 10 * 10**9


def default_strategy(spec: ModelSpec) -> tuple[StrategyName, str]:
    """The size-threshold default and its one-line rationale."""
    billions = spec.total_params / 1e9
    if spec.total_params < SMALL_MODEL:
        return "ddp", f"{billions:.2g}B parameters (< 1B): replicas fit, DDP communicates least"
    if spec.total_params <= LARGE_MODEL:
        return "zero3", f"{billions:.3g}B parameters (1-10B): full sharding (FSDP FULL_SHARD / ZeRO-3)"
    return "zero3", f"{billions:.3g}B parameters (> 10B): full sharding, CPU offload considered"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def choose_fastest(
    spec: ModelSpec, candidates: list[Candidate], *, global_batch_size: int | None = None
) -> tuple[Recommendation | None, list[str]]:
    """``--policy fastest``: among candidates that fit, the most tokens per second (the least time per
    global batch, which gradient accumulation keeps fixed); the 'why' compares it with the default."""
    fitting = [c for c in candidates if c.fits and c.step_time is not None]
    if not fitting:
        return choose(spec, candidates)
    default, rationale = default_strategy(spec)
    best = rank_by_time([(c, c.step_time) for c in fitting])[0][1].tokens_per_s
    # Ties (within 0.5%) go to the size default, then to the strategy that communicates least.
    tied = [c for c in fitting if c.step_time.tokens_per_s >= best * 0.995]
    fastest = min(tied, key=lambda c: (c.strategy != default, ESCALATION.index(c.strategy)
                                       if c.strategy in ESCALATION else -1))
    rate = f"{fastest.step_time.tokens_per_s:,.0f} tokens/s (MFU {fastest.step_time.mfu:.0%})"
    if len(fitting) > 1:
        why = [f"Policy fastest: of {len(fitting)} candidates that fit, {fastest.strategy} is fastest: {rate}."]
    else:
        why = [f"Policy fastest: {fastest.strategy} is the only candidate that fits: {rate}."]
    base = next((c for c in fitting if c.strategy == default), None)
    if base is not None and base.strategy != fastest.strategy:
        why.append(explain_tradeoff((fastest.strategy, fastest.step_time), (base.strategy, base.step_time),
                                    global_batch_size=global_batch_size))
    elif base is None:
        why.append(f"The size default {default} ({rationale}) does not fit.")
    else:
        why.append(f"It is also the size default ({rationale}).")
    return _recommend(fastest, " ".join(why)), why


def _share(cand: Candidate) -> float:
    return cand.memory_bytes.total / cand.capacity_bytes


def _figures(cand: Candidate, *, first: bool) -> str:
    """``zero2 71% of memory, 1.90 s/step at micro-batch 4 (35,000 tokens/s)``; the second of a pair
    drops ``of memory``. Tokens/s is what compares candidates whose micro-batches differ."""
    step = cand.step_time
    return (f"{cand.strategy} {_share(cand):.0%}{' of memory' if first else ''}, {step.step_s:.2f} s/step at "
            f"micro-batch {cand.micro_batch_size} ({step.tokens_per_s:,.0f} tokens/s)")


def prefer_practical(chosen: Candidate, fitting: list[Candidate], *, headroom: float) -> tuple[Candidate, str | None]:
    """Among fitting candidates as fast as ``chosen`` (tokens/s within ``SAME_SPEED``), the one a
    practitioner runs, and the sentence that says why in numbers (None when no peer is as fast).

    The margin policy: a plan fits when its peak plus runtime overhead is at most the GPU's memory;
    one that also leaves ``headroom`` free is comfortable. Comfortable plans come first, and among
    them the one that communicates least (``ESCALATION`` order). When none is comfortable (the auto
    micro-batch stops at the headroom, so only a plan at micro-batch 1 or a pinned one can be past it)
    the size-threshold choice stands.
    """
    if chosen.step_time is None:
        return chosen, None
    speed = chosen.step_time.tokens_per_s
    # Peers are as fast within SAME_SPEED either way: a much faster plan is --policy fastest's business,
    # and calling it "as fast" would misstate the numbers printed beside it.
    # A GPU-only choice has GPU-only peers: offload is for when nothing fits on the GPUs alone.
    peers = [c for c in fitting if c.strategy in ESCALATION and c.step_time is not None
             and abs(c.step_time.tokens_per_s - speed) <= SAME_SPEED * speed
             and (offloads(chosen) or not offloads(c))]
    if len(peers) < 2:
        return chosen, None

    def roomy(c: Candidate) -> bool:
        return _share(c) <= 1 - headroom

    def key(c: Candidate) -> tuple[bool, int]:
        return (not roomy(c), ESCALATION.index(c.strategy) if roomy(c) else int(c is not chosen))

    best = min(peers, key=key)
    runner_up = chosen if best is not chosen else min((c for c in peers if c is not best), key=key)
    limit = f"{1 - headroom:.0%}"
    if roomy(best) and not roomy(runner_up):
        because = f"only {best.strategy} stays within {limit} of memory (the {headroom:.0%} headroom policy)"
    elif roomy(best):
        because = f"both stay within {limit} of memory and {best.strategy} communicates less"
    else:
        because = (f"neither stays within {limit} of memory (the {headroom:.0%} headroom policy), so the "
                   "size-threshold choice stands")
    return best, (f"{best.strategy} rather than {runner_up.strategy}: {_figures(best, first=True)} vs "
                  f"{_figures(runner_up, first=False)}; as fast (within {SAME_SPEED:.0%}) and {because}.")


def choose(
    spec: ModelSpec, candidates: list[Candidate], *, only: StrategyName | None = None,
    headroom: float = TrainingConfig.model_fields["headroom"].default,
) -> tuple[Recommendation | None, list[str]]:
    """The recommendation and the lines of 'why': size thresholds, then escalation, then the margin
    policy among plans as fast as that choice (``prefer_practical``)."""
    by_name = {c.strategy: c for c in candidates}
    fitting = [c for c in candidates if c.available and c.fits]
    if only is not None:
        cand = by_name[only]
        if not cand.fits:
            return None, [_does_not_fit(cand)]
        return _recommend(cand, f"{only} was requested and fits"), [f"{only} was requested; it fits."]
    default, rationale = default_strategy(spec)
    why = [f"Default from size: {default} ({rationale})."]
    start = ESCALATION.index(default)
    chosen = _escalate(by_name, default, fitting)
    if chosen is None:
        why.append(_does_not_fit(by_name[default]))
        last = ESCALATION[-1]
        if last != default and last in by_name:
            why.append(_does_not_fit(by_name[last]))
        return None, why
    chosen, offload_note = _fastest_offload(chosen, fitting)
    size_choice = chosen
    chosen, comparison = prefer_practical(chosen, fitting, headroom=headroom)
    if size_choice.strategy == default:
        why.append(f"{default} fits: {_gib(size_choice.memory_bytes.total)} of {_gib(size_choice.capacity_bytes)} "
                   f"per GPU ({_share(size_choice):.0%}) at micro-batch {size_choice.micro_batch_size}"
                   f"{_with_checkpointing(size_choice)}.")
    else:
        why.append(_does_not_fit(by_name[default]))
        direction = "escalated" if ESCALATION.index(size_choice.strategy) > start else "fell back"
        on_gpu = [c for c in fitting if c.strategy in ESCALATION and not offloads(c)]
        among = (f" (the fastest of {len(on_gpu)} that fit on the GPUs alone: "
                 f"{size_choice.step_time.tokens_per_s:,.0f} tokens/s)" if len(on_gpu) > 1 else "")
        why.append(f"{direction} to {size_choice.strategy}: {_gib(size_choice.memory_bytes.total)} of "
                   f"{_gib(size_choice.capacity_bytes)} per GPU at micro-batch {size_choice.micro_batch_size}{among}.")
    if offload_note is not None:
        why.append(offload_note)
    reason_lines = why[1:]
    if comparison is not None:
        why.append(comparison)
        reason_lines = why[1:]
    if chosen.cpu_memory_bytes:
        checked = ("checked only when --cpu-memory-gib is given" if chosen.cpu_capacity_bytes is None else
                   f"of {_gib(chosen.cpu_capacity_bytes)} given by --cpu-memory-gib")
        why.append(f"{chosen.strategy} needs {_gib(chosen.cpu_memory_bytes)} of CPU RAM per node for offloaded "
                   f"states ({checked}).")
    if chosen.selective_checkpointing:
        why.append("Selective activation checkpointing is on (attention outputs and every other matmul kept): "
                   "without it no micro-batch fits, and it recomputes less than full checkpointing.")
    elif chosen.activation_checkpointing:
        why.append("Activation checkpointing is on: without it no micro-batch fits (costs ~1/3 more compute).")
    cheaper = [c for c in fitting if c.strategy in ESCALATION and c is not chosen
               and ESCALATION.index(c.strategy) < ESCALATION.index(chosen.strategy)]
    alternatives = tuple(f"{c.strategy} also fits ({_share(c):.0%} of memory, micro-batch {c.micro_batch_size}"
                         f"{f', {c.step_time.step_s:.2f} s/step' if c.step_time else ''}) and communicates less"
                         for c in cheaper)
    why.extend(alternatives)
    return _recommend(chosen, " ".join(reason_lines), alternatives), why


def _escalate(by_name: dict[str, Candidate], default: StrategyName, fitting: list[Candidate]) -> Candidate | None:
    """The size default when it fits; otherwise the fastest GPU-only candidate that fits (``prefer_practical``
    then applies the headroom policy among those as fast), whichever side of the default it lies;
    offload only when no GPU-only candidate fits, the first along ``ESCALATION`` from the default."""
    if default in by_name and by_name[default].fits:
        return by_name[default]
    on_gpu = [c for c in fitting if c.strategy in ESCALATION and not offloads(c) and c.step_time is not None]
    if on_gpu:  # ties keep the one that communicates least
        return max(on_gpu, key=lambda c: (round(c.step_time.tokens_per_s, 6), -ESCALATION.index(c.strategy)))
    start = ESCALATION.index(default)
    order = [*ESCALATION[start:], *ESCALATION[:start]]
    return next((by_name[n] for n in order if n in by_name and by_name[n].fits), None)


def offloads(cand: Candidate) -> bool:
    """The candidate keeps parameters or optimizer state on the CPU."""
    impl = STRATEGIES[cand.strategy].on(cand.engine)
    return impl.offload_params or impl.offload_optimizer


def _fastest_offload(chosen: Candidate, fitting: list[Candidate]) -> tuple[Candidate, str | None]:
    """Escalation reaches offload only when nothing fits on the GPUs alone; once there, the offload
    variants differ mostly in how large a micro-batch they leave room for, so take the fastest."""
    if not offloads(chosen) or chosen.step_time is None:
        return chosen, None
    peers = [c for c in fitting if offloads(c) and c.step_time is not None and c.mesh is None]
    best = max(peers, key=lambda c: c.step_time.tokens_per_s)
    if best is chosen or best.step_time.tokens_per_s <= chosen.step_time.tokens_per_s * (1 + SAME_SPEED):
        return chosen, None
    return best, (f"{best.strategy} rather than {chosen.strategy}: both offload, and {best.strategy} runs "
                  f"{best.step_time.tokens_per_s:,.0f} tokens/s (micro-batch {best.micro_batch_size}) against "
                  f"{chosen.step_time.tokens_per_s:,.0f} (micro-batch {chosen.micro_batch_size}).")


def _with_checkpointing(cand: Candidate) -> str:
    return {"off": "", "on": " with activation checkpointing",
            "selective": " with selective activation checkpointing"}[cand.checkpointing]


def _recommend(cand: Candidate, reason: str, alternatives: tuple[str, ...] = ()) -> Recommendation:
    return Recommendation(candidate=cand, reason=reason, alternatives=alternatives)


def _does_not_fit(cand: Candidate) -> str:
    if not cand.available:
        return f"{cand.strategy} is unavailable: {cand.unavailable_reason}."
    mem, span = cand.memory_bytes, cand.memory_range
    cpu_fits = cand.cpu_capacity_bytes is None or (cand.cpu_memory_bytes or 0) <= cand.cpu_capacity_bytes
    if mem.total <= cand.capacity_bytes and span is not None and span.high > cand.capacity_bytes and cpu_fits:
        return (f"{cand.strategy} does not fit at the high end of its range (--margin high): "
                f"{_gib(span.high)} per GPU of {_gib(cand.capacity_bytes)} (expected {_gib(mem.total)}) even at "
                f"micro-batch {cand.micro_batch_size}{' with checkpointing' if cand.activation_checkpointing else ''}.")
    if mem.total <= cand.capacity_bytes and cand.cpu_capacity_bytes is not None:
        return (f"{cand.strategy} does not fit in CPU RAM: needs {_gib(cand.cpu_memory_bytes or 0)} per node "
                f"of {_gib(cand.cpu_capacity_bytes)}.")
    return (f"{cand.strategy} does not fit: needs {_gib(mem.total)} per GPU of {_gib(cand.capacity_bytes)} "
            f"even at micro-batch {cand.micro_batch_size}"
            f"{' with checkpointing' if cand.activation_checkpointing else ''}.")
