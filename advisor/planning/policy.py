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
from advisor.planning import reasons as r
from advisor.planning.candidates import SAME_SPEED, Candidate, Recommendation
from advisor.planning.fastest import explain_tradeoff, rank_by_time
from advisor.planning.render import render_alternative, render_reason, size_rationale
from advisor.strategies import ESCALATION, STRATEGIES, StrategyName
from advisor.training import TrainingConfig

SMALL_MODEL = 10**9
LARGE_MODEL = 10 * 10**9


def default_strategy(spec: ModelSpec, *, world: int = 0) -> tuple[StrategyName, str]:
    """The size-threshold default and its one-line rationale (``world``: the GPU count, 0 when not known)."""
    default = size_default(spec, world=world)
    return default.strategy, size_rationale(default)


def size_default(spec: ModelSpec, kind: type[r.SizeBand] = r.SizeDefault, *, world: int = 0) -> r.SizeBand:
    """The size-threshold default as a reason (``kind``: which sentence quotes it). On one GPU the plain model
    (``ddp``: no wrapper there) whatever the size: FSDP on a world of one shards nothing (only CPU offload gives
    it a use, which the escalation reaches when nothing fits on the GPU)."""
    n = spec.total_params
    band = ("one-gpu" if world == 1 else "small" if n < SMALL_MODEL else "medium" if n <= LARGE_MODEL else "large")
    return kind(strategy="ddp" if band in ("small", "one-gpu") else "zero3", num_params=n, band=band)


def checkpointing(cand: Candidate) -> r.Checkpointing:
    """The candidate's mode (``off`` for one never evaluated)."""
    return cand.checkpointing or "off"


def choose_fastest(
    spec: ModelSpec, candidates: list[Candidate], *, global_batch_size: int | None = None, world: int = 0
) -> tuple[Recommendation | None, list[str]]:
    """``--policy fastest``: among candidates that fit, the most tokens per second (the least time per
    global batch, which gradient accumulation keeps fixed); the 'why' compares it with the default."""
    fitting = [c for c in candidates if c.fits and c.step_time is not None]
    if not fitting:
        return choose(spec, candidates, world=world)
    default = default_strategy(spec, world=world)[0]
    best = rank_by_time([(c, c.step_time) for c in fitting])[0][1].tokens_per_s
    # Ties (within 0.5%) go to the size default, then to the strategy that communicates least.
    tied = [c for c in fitting if c.step_time.tokens_per_s >= best * 0.995]
    fastest = min(tied, key=lambda c: (c.strategy != default, ESCALATION.index(c.strategy)
                                       if c.strategy in ESCALATION else -1))
    why: list[r.Reason] = [r.FastestPolicy(strategy=fastest.strategy, num_fitting=len(fitting),
                                           tokens_per_s=fastest.step_time.tokens_per_s, mfu=fastest.step_time.mfu)]
    base = next((c for c in fitting if c.strategy == default), None)
    if base is not None and base.strategy != fastest.strategy:
        why.append(explain_tradeoff((fastest.strategy, fastest.step_time), (base.strategy, base.step_time),
                                    global_batch_size=global_batch_size))
    elif base is None:
        why.append(size_default(spec, r.SizeDefaultUnfit, world=world))
    else:
        why.append(size_default(spec, r.AlsoSizeDefault, world=world))
    return _recommend(fastest, tuple(why)), why


def _share(cand: Candidate) -> float:
    return cand.memory_bytes.total / cand.capacity_bytes


def _figures(cand: Candidate) -> r.Figures:
    """Memory share, step time and tokens/s (what compares candidates whose micro-batches differ)."""
    return r.Figures(strategy=cand.strategy, total_bytes=cand.memory_bytes.total, capacity_bytes=cand.capacity_bytes,
                     step_s=cand.step_time.step_s, micro_batch_size=cand.micro_batch_size,
                     tokens_per_s=cand.step_time.tokens_per_s)


def as_fast(a: float, b: float) -> bool:
    """Two throughputs count as the same speed: within ``SAME_SPEED`` of the faster one, whichever is asked about
    first (so 'as fast' and 'faster' never both hold of one pair)."""
    return abs(a - b) <= SAME_SPEED * max(a, b)


def prefer_practical(chosen: Candidate, fitting: list[Candidate], *,
                     headroom: float, one_gpu: bool = False) -> tuple[Candidate, r.MarginChoice | None]:
    """Among fitting candidates as fast as ``chosen`` (tokens/s within ``SAME_SPEED``), the one a
    practitioner runs, and the reason that says why in numbers (None when no peer is as fast).

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
             and as_fast(c.step_time.tokens_per_s, speed) and (offloads(chosen) or not offloads(c))]
    if len(peers) < 2:
        return chosen, None

    def roomy(c: Candidate) -> bool:
        return _share(c) <= 1 - headroom

    def key(c: Candidate) -> tuple[bool, int]:
        return (not roomy(c), ESCALATION.index(c.strategy) if roomy(c) else int(c is not chosen))

    best = min(peers, key=key)
    runner_up = chosen if best is not chosen else min((c for c in peers if c is not best), key=key)
    roomy_ = "chosen-only" if roomy(best) and not roomy(runner_up) else "both" if roomy(best) else "neither"
    return best, r.MarginChoice(chosen=_figures(best), runner_up=_figures(runner_up), same_speed=SAME_SPEED,
                                headroom=headroom, roomy=roomy_, one_gpu=one_gpu)


def prefer_dominating(chosen: Candidate, fitting: list[Candidate]) -> tuple[Candidate, r.Dominates | None]:
    """A GPU-only plan faster than ``chosen`` (tokens/s above ``SAME_SPEED``) that needs no more memory
    beats it whatever the size thresholds say (FSDP on one GPU shards nothing and only adds its buffers); the
    fastest such plan, and the reason in numbers; ``chosen`` and None when none is."""
    if chosen.step_time is None:
        return chosen, None
    speed, total = chosen.step_time.tokens_per_s, chosen.memory_bytes.total
    better = [c for c in fitting if c.strategy in ESCALATION and not offloads(c) and c.step_time is not None
              and c.step_time.tokens_per_s > speed and not as_fast(c.step_time.tokens_per_s, speed)
              and c.memory_bytes.total <= total]
    if not better:
        return chosen, None
    best = max(better, key=lambda c: (c.step_time.tokens_per_s, -ESCALATION.index(c.strategy)))
    return best, r.Dominates(chosen=_figures(best), runner_up=_figures(chosen), same_speed=SAME_SPEED)


def choose(
    spec: ModelSpec, candidates: list[Candidate], *, only: StrategyName | None = None,
    headroom: float = TrainingConfig.model_fields["headroom"].default,
    margin: str = TrainingConfig.model_fields["margin"].default, world: int = 0,
) -> tuple[Recommendation | None, list[str]]:
    """The recommendation and the lines of 'why': size thresholds, then escalation, then the margin
    policy among plans as fast as that choice (``prefer_practical``)."""
    by_name = {c.strategy: c for c in candidates}
    fitting = [c for c in candidates if c.available and c.fits]
    if only is not None:
        cand = by_name[only]
        if not cand.fits:
            return None, [_does_not_fit(cand)]
        requested = r.Requested(strategy=only)
        return _recommend(cand, (requested,)), [requested]
    opening = size_default(spec, world=world)
    default = opening.strategy
    why: list[r.Reason] = [opening]
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
    chosen, comparison = prefer_practical(chosen, fitting, headroom=headroom, one_gpu=world == 1)
    chosen, dominating = prefer_dominating(chosen, fitting)
    figures = dict(strategy=size_choice.strategy, total_bytes=size_choice.memory_bytes.total,
                   capacity_bytes=size_choice.capacity_bytes, micro_batch_size=size_choice.micro_batch_size,
                   checkpointing=checkpointing(size_choice))
    if size_choice.strategy == default:
        why.append(r.DefaultFits(**figures))
    else:
        why.append(_does_not_fit(by_name[default]))
        direction = ("escalated" if size_choice.strategy in ESCALATION and ESCALATION.index(size_choice.strategy) > start
                     else "fell back")
        on_gpu = [c for c in fitting if c.strategy in ESCALATION and not offloads(c)]
        step = size_choice.step_time
        why.append(r.Escalated(**figures, direction=direction, num_fitting_on_gpu=len(on_gpu),
                               tokens_per_s=step.tokens_per_s if step is not None else None))
    if offload_note is not None:
        why.append(offload_note)
    reason_lines = why[1:]
    # A plan the dominance rule replaced is no longer the subject: the headroom comparison that chose it is dropped.
    for found in (comparison if dominating is None else None, dominating):
        if found is not None:
            why.append(found)
            reason_lines = why[1:]
    if chosen.cpu_memory_bytes:
        why.append(r.CpuRam(strategy=chosen.strategy, cpu_bytes=chosen.cpu_memory_bytes,
                            cpu_capacity_bytes=chosen.cpu_capacity_bytes,
                            activations=bool(chosen.memory_bytes and chosen.memory_bytes.activations_on_cpu)))
    if chosen.activation_checkpointing or chosen.selective_checkpointing:
        mode = "selective" if chosen.selective_checkpointing else "on"
        if chosen.uncheckpointed is None or chosen.step_time is None:
            offloaded = bool(chosen.memory_bytes and chosen.memory_bytes.activations_on_cpu)
            why.append(r.CheckpointingOn(mode=mode, offload=offloaded))
        else:  # it also fitted without checkpointing, past the headroom or slower (advisor.planning.candidates)
            micro, total, tokens = chosen.uncheckpointed
            why.append(r.CheckpointingForHeadroom(mode=mode, micro_batch_size=micro, total_bytes=total,
                                                  capacity_bytes=chosen.capacity_bytes, margin=margin, headroom=headroom,
                                                  tokens_per_s=tokens, chosen_tokens_per_s=chosen.step_time.tokens_per_s))
    cheaper = [c for c in fitting if c.strategy in ESCALATION and c is not chosen and chosen.strategy in ESCALATION
               and ESCALATION.index(c.strategy) < ESCALATION.index(chosen.strategy)]
    alternatives = tuple(r.AlsoFits(strategy=c.strategy, total_bytes=c.memory_bytes.total,
                                    capacity_bytes=c.capacity_bytes, micro_batch_size=c.micro_batch_size,
                                    step_s=c.step_time.step_s if c.step_time else None, one_gpu=world == 1)
                         for c in cheaper)
    why.extend(alternatives)
    return _recommend(chosen, tuple(reason_lines), alternatives), why


def _escalate(by_name: dict[str, Candidate], default: StrategyName, fitting: list[Candidate]) -> Candidate | None:
    """The size default when it fits; otherwise the fastest GPU-only candidate that fits (``prefer_practical``
    then applies the headroom policy among those as fast), whichever side of the default it lies;
    offload only when no GPU-only candidate fits, the first along ``ESCALATION`` from the default."""
    if default in by_name and by_name[default].fits:
        return by_name[default]
    on_gpu = [c for c in fitting if c.strategy in ESCALATION and not offloads(c) and c.step_time is not None]
    if on_gpu:  # ties keep the one that communicates least
        return max(on_gpu, key=lambda c: (round(c.step_time.tokens_per_s, 6), -ESCALATION.index(c.strategy)))
    # DataParallel is outside the escalation (one process, GPU 0 the bottleneck), but a GPU-only plan still comes
    # before CPU offload (one GPU: DataParallel calls the module itself, the plain model).
    single = [c for c in fitting if not offloads(c) and c.step_time is not None and c.strategy not in ESCALATION]
    if single:
        return max(single, key=lambda c: c.step_time.tokens_per_s)
    start = ESCALATION.index(default)
    order = [*ESCALATION[start:], *ESCALATION[:start]]
    return next((by_name[n] for n in order if n in by_name and by_name[n].fits), None)


def offloads(cand: Candidate) -> bool:
    """The candidate keeps parameters or optimizer state on the CPU."""
    return STRATEGIES[cand.strategy].on(cand.engine).offloads


def _fastest_offload(chosen: Candidate, fitting: list[Candidate]) -> tuple[Candidate, r.FasterOffload | None]:
    """Escalation reaches offload only when nothing fits on the GPUs alone; once there, the offload
    variants differ mostly in how large a micro-batch they leave room for, so take the fastest."""
    if not offloads(chosen) or chosen.step_time is None:
        return chosen, None
    peers = [c for c in fitting if offloads(c) and c.step_time is not None and c.mesh is None]
    best = max(peers, key=lambda c: c.step_time.tokens_per_s)
    if best is chosen or as_fast(best.step_time.tokens_per_s, chosen.step_time.tokens_per_s):
        return chosen, None  # "faster" as as_fast measures it: against the faster of the pair
    return best, r.FasterOffload(strategy=best.strategy, tokens_per_s=best.step_time.tokens_per_s,
                                 micro_batch_size=best.micro_batch_size, instead_of=chosen.strategy,
                                 instead_tokens_per_s=chosen.step_time.tokens_per_s,
                                 instead_micro_batch_size=chosen.micro_batch_size)


def offload_not_taken(chosen: Candidate, candidates: list[Candidate]) -> r.OffloadNotTaken | None:
    """The fastest data-parallel offload plan that fits and runs faster than the GPU-only ``chosen`` (tokens/s
    above ``SAME_SPEED``, as ``as_fast`` measures it), as a reason; None when there is none. The policy keeps the
    GPU-only plan (offload only when nothing fits on the GPUs alone: host RAM, PCIe traffic shared by the node's
    GPUs); the reason names the trade so the user can take it."""
    if offloads(chosen) or chosen.step_time is None or chosen.mesh is not None:
        return None
    speed = chosen.step_time.tokens_per_s
    faster = [c for c in candidates if c.available and c.fits and c.mesh is None and offloads(c)
              and c.step_time is not None and c.step_time.tokens_per_s > speed
              and not as_fast(c.step_time.tokens_per_s, speed)]
    if not faster:
        return None
    best = max(faster, key=lambda c: c.step_time.tokens_per_s)
    return r.OffloadNotTaken(strategy=best.strategy, tokens_per_s=best.step_time.tokens_per_s,
                             micro_batch_size=best.micro_batch_size, checkpointing=checkpointing(best),
                             cpu_bytes=best.cpu_memory_bytes or 0, chosen=chosen.strategy, chosen_tokens_per_s=speed)


def _recommend(cand: Candidate, reasons: tuple[r.Reason, ...], alternatives: tuple[r.Reason, ...] = ()
               ) -> Recommendation:
    return Recommendation(candidate=cand, reasons=reasons, reason=render_reason(reasons),
                          alternatives=tuple(render_alternative(a) for a in alternatives))


def _does_not_fit(cand: Candidate) -> r.Reason:
    if not cand.available:
        return r.Unavailable(strategy=cand.strategy, detail=cand.unavailable_reason or "")
    mem, span = cand.memory_bytes, cand.memory_range
    cpu_fits = cand.cpu_capacity_bytes is None or (cand.cpu_memory_bytes or 0) <= cand.cpu_capacity_bytes
    figures = dict(strategy=cand.strategy, total_bytes=mem.total, capacity_bytes=cand.capacity_bytes,
                   micro_batch_size=cand.micro_batch_size, checkpointing=checkpointing(cand))
    if mem.total <= cand.capacity_bytes and span is not None and span.high > cand.capacity_bytes and cpu_fits:
        return r.HighEndDoesNotFit(**figures, high_bytes=span.high)
    if mem.total <= cand.capacity_bytes and cand.cpu_capacity_bytes is not None:
        return r.CpuRamDoesNotFit(strategy=cand.strategy, cpu_bytes=cand.cpu_memory_bytes or 0,
                                  cpu_capacity_bytes=cand.cpu_capacity_bytes)
    return r.DoesNotFit(**figures)
