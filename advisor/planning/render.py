"""The one place a reason becomes a sentence: ``render(reason) -> str``.

``advisor.planning.reasons`` holds the numbers; this module only formats them (GiB with one decimal,
shares as percentages, tokens/s with thousands separators). ``Plan.why``, ``Recommendation.reason`` and
``Recommendation.alternatives`` (read by ``wrap()``, the callbacks, ``compare`` and ``--json``) are
rendered here, so the text is the same wherever it is printed; so are the remedies' lines
(``remedy_line``, from ``Remedy``'s own numbers).
"""

from __future__ import annotations

from typing import Callable

from advisor.model.spec import size_label
from advisor.planning import reasons as r
from advisor.units import GIB

MIN_SAVED_GIB = 0.05  # the smallest saving printed (one decimal) as more than nothing


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _share(total: int, capacity: int) -> float:
    return total / capacity


def _count(n: int, small: str = ".3g") -> str:
    """``7.62B``; in trillions from a thousand billion (``size_label``: billions printed 1e+03B); below 0.1B in
    millions or thousands (``27K``: billions printed 2.7e-05B)."""
    if n >= 999.5e9:
        return size_label(n)
    if n >= 1e8:
        return f"{n / 1e9:{small}}B"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}K"


def size_rationale(x: r.SizeBand) -> str:
    """``7.62B parameters (1-10B): full sharding (FSDP FULL_SHARD / ZeRO-3)``."""
    if x.band == "one-gpu":
        return f"{_count(x.num_params)} parameters on one GPU: nothing to shard or replicate, the plain model"
    if x.band == "small":
        return f"{_count(x.num_params, small='.2g')} parameters (< 1B): replicas fit, DDP communicates least"
    if x.band == "medium":
        return f"{_count(x.num_params)} parameters (1-10B): full sharding (FSDP FULL_SHARD / ZeRO-3)"
    return f"{_count(x.num_params)} parameters (> 10B): full sharding, CPU offload considered"


def _with_ckpt(mode: r.Checkpointing) -> str:
    return "" if mode == "off" else " with checkpointing"


def _with_which_ckpt(mode: r.Checkpointing) -> str:
    return {"off": "", "on": " with activation checkpointing", "selective": " with selective activation checkpointing"}[mode]


def _default_fits(x: r.DefaultFits) -> str:
    return (f"{x.strategy} fits: {_gib(x.total_bytes)} of {_gib(x.capacity_bytes)} per GPU "
            f"({_share(x.total_bytes, x.capacity_bytes):.0%}) at micro-batch {x.micro_batch_size}"
            f"{_with_which_ckpt(x.checkpointing)}.")


def _does_not_fit(x: r.DoesNotFit) -> str:
    return (f"{x.strategy} does not fit: needs {_gib(x.total_bytes)} per GPU of {_gib(x.capacity_bytes)} "
            f"even at micro-batch {x.micro_batch_size}{_with_ckpt(x.checkpointing)}.")


def _high_end(x: r.HighEndDoesNotFit) -> str:
    return (f"{x.strategy} does not fit at the high end of its range (--margin high): "
            f"{_gib(x.high_bytes)} per GPU of {_gib(x.capacity_bytes)} (expected {_gib(x.total_bytes)}) even at "
            f"micro-batch {x.micro_batch_size}{_with_ckpt(x.checkpointing)}.")


def _escalated(x: r.Escalated) -> str:
    among = (f" (the fastest of {x.num_fitting_on_gpu} that fit on the GPUs alone: {x.tokens_per_s:,.0f} tokens/s)"
             if x.num_fitting_on_gpu > 1 else "")
    return (f"{x.direction} to {x.strategy}: {_gib(x.total_bytes)} of {_gib(x.capacity_bytes)} per GPU at "
            f"micro-batch {x.micro_batch_size}{among}.")


def _faster_offload(x: r.FasterOffload) -> str:
    return (f"{x.strategy} rather than {x.instead_of}: both offload, and {x.strategy} runs {x.tokens_per_s:,.0f} "
            f"tokens/s (micro-batch {x.micro_batch_size}) against {x.instead_tokens_per_s:,.0f} (micro-batch "
            f"{x.instead_micro_batch_size}).")


def _offload_not_taken(x: r.OffloadNotTaken) -> str:
    return (f"{x.strategy} would run faster: {x.tokens_per_s:,.0f} tokens/s against {x.chosen}'s "
            f"{x.chosen_tokens_per_s:,.0f} ({x.tokens_per_s / x.chosen_tokens_per_s - 1:+.0%}) at micro-batch "
            f"{x.micro_batch_size}{_with_which_ckpt(x.checkpointing) or ' without checkpointing'}, with "
            f"{_gib(x.cpu_bytes)} of CPU RAM per node; offload is taken only when nothing fits on the GPUs alone "
            f"(--strategy {x.strategy} or --policy fastest runs it).")


def _figures(f: r.Figures, *, first: bool) -> str:
    return (f"{f.strategy} {_share(f.total_bytes, f.capacity_bytes):.0%}{' of memory' if first else ''}, "
            f"{f.step_s:.2f} s/step at micro-batch {f.micro_batch_size} ({f.tokens_per_s:,.0f} tokens/s)")


def _margin(x: r.MarginChoice) -> str:
    limit = f"{1 - x.headroom:.0%}"
    best = x.chosen.strategy
    because = {
        "chosen-only": f"only {best} stays within {limit} of memory (the {x.headroom:.0%} headroom policy)",
        "both": f"both stay within {limit} of memory and {best} {_simpler(best, x.one_gpu)}",
        "neither": (f"neither stays within {limit} of memory (the {x.headroom:.0%} headroom policy), so the "
                    + ("one-GPU default stands" if x.one_gpu else "size-threshold choice stands")),
    }[x.roomy]
    return (f"{best} rather than {x.runner_up.strategy}: {_figures(x.chosen, first=True)} vs "
            f"{_figures(x.runner_up, first=False)}; as fast (within {x.same_speed:.0%}) and {because}.")


def _dominates(x: r.Dominates) -> str:
    return (f"{x.chosen.strategy} rather than {x.runner_up.strategy}: {_figures(x.chosen, first=True)} vs "
            f"{_figures(x.runner_up, first=False)}; faster (by more than {x.same_speed:.0%}) and needs no more memory.")


def _cpu_ram(x: r.CpuRam) -> str:
    checked = ("checked only when --cpu-memory-gib is given" if x.cpu_capacity_bytes is None else
               f"of {_gib(x.cpu_capacity_bytes)} given by --cpu-memory-gib")
    what = "offloaded states and activations" if x.activations else "offloaded states"
    if x.activations and x.strategy in ("ddp", "zero1", "zero2", "zero3", "dp"):
        what = "offloaded activations"
    return f"{x.strategy} needs {_gib(x.cpu_bytes)} of CPU RAM per node for {what} ({checked})."


def _checkpointing_on(x: r.CheckpointingOn) -> str:
    if x.offload:  # advisor.estimate.activation_offload: planned under checkpointing only
        kind = "Selective activation checkpointing" if x.mode == "selective" else "Activation checkpointing"
        return (f"{kind} is on: --activation-offload runs under it (each block's input is what goes to CPU "
                "memory), as torchtune requires.")
    if x.mode == "selective":
        return ("Selective activation checkpointing is on (attention outputs and every other matmul kept): "
                "without it no micro-batch fits, and it recomputes less than full checkpointing.")
    return "Activation checkpointing is on: without it no micro-batch fits (costs ~1/3 more compute)."


def _checkpointing_for_headroom(x: r.CheckpointingForHeadroom) -> str:
    what = "Selective activation checkpointing" if x.mode == "selective" else "Activation checkpointing"
    end = "" if x.margin == "expected" else f" at the {x.margin} end of its range"
    if x.chosen_tokens_per_s > x.tokens_per_s:  # the checkpointed plan is the faster: that is the reason given
        return (f"{what} is on: the larger micro-batch it makes room for runs faster: without it micro-batch "
                f"{x.micro_batch_size} needs {_gib(x.total_bytes)} of {_gib(x.capacity_bytes)}{end} "
                f"({_share(x.total_bytes, x.capacity_bytes):.0%}) and runs {x.tokens_per_s:,.0f} tokens/s; this plan "
                f"{x.chosen_tokens_per_s:,.0f}.")
    return (f"{what} is on: without it micro-batch {x.micro_batch_size} needs {_gib(x.total_bytes)} of "
            f"{_gib(x.capacity_bytes)}{end} ({_share(x.total_bytes, x.capacity_bytes):.0%}), past the "
            f"{x.headroom:.0%} headroom ({x.tokens_per_s:,.0f} tokens/s; this plan {x.chosen_tokens_per_s:,.0f}).")


def _simpler(strategy: str, one_gpu: bool) -> str:
    """Why a strategy earlier in the escalation order is the simpler one: it communicates less; on one GPU, where
    nothing communicates, the plain model needs no wrapper and the others come earlier in that order."""
    if not one_gpu:
        return "communicates less"
    return "needs no wrapper (one GPU)" if strategy == "ddp" else "comes earlier in the escalation order (one GPU)"


def _also_fits(x: r.AlsoFits) -> str:
    step = f", {x.step_s:.2f} s/step" if x.step_s is not None else ""
    return (f"{x.strategy} also fits ({_share(x.total_bytes, x.capacity_bytes):.0%} of memory, micro-batch "
            f"{x.micro_batch_size}{step}) and {_simpler(x.strategy, x.one_gpu)}")


def _fastest(x: r.FastestPolicy) -> str:
    rate = f"{x.tokens_per_s:,.0f} tokens/s (MFU {x.mfu:.0%})"
    if x.num_fitting > 1:
        return (f"Policy fastest: of {x.num_fitting} data-parallel strategies that fit, {x.strategy} is fastest: "
                f"{rate}.")
    return f"Policy fastest: {x.strategy} is the only data-parallel strategy that fits: {rate}."


def _gap(g: r.Gap, slow: str) -> str:
    if isinstance(g, r.Spends):
        return f"{slow} spends {g.slow_s:.2f} s on {g.label} vs {g.fast_s:.2f} s"
    if isinstance(g, r.Recomputes):
        return f"{slow} recomputes activations (one extra forward)"
    return f"micro-batch {g.fast} vs {g.slow}"


def _tradeoff(x: r.Tradeoff) -> str:
    if x.fast == x.slow or abs(x.slow_batch_s - x.fast_batch_s) < 1e-12:
        return (f"{x.fast} is the default and the fastest that fits ({x.fast_batch_s:.2f} s per global batch of "
                f"{x.global_batch_size}).")
    because = "; ".join(_gap(g, x.slow) for g in x.gaps)
    why = f" because {because}" if because else ""
    return (f"{x.fast} is {x.slow_batch_s / x.fast_batch_s:.2f}x faster than {x.slow} ({x.fast_batch_s:.2f} s vs "
            f"{x.slow_batch_s:.2f} s per global batch of {x.global_batch_size} samples; {x.fast_tokens_per_s:,.0f} vs "
            f"{x.slow_tokens_per_s:,.0f} tokens/s){why}.")


def _offload_remedy(x: r.OffloadRemedy, *, host_bytes: int | None = None) -> str:
    """``host_bytes``: the CPU RAM a node holds for the offloaded states, said where the tokens/s would be (the CLI's
    answer line gives those); the --json why keeps the tokens/s."""
    where = "runs on the GPUs alone" if x.remedy_fits else "still offloads but runs"
    saving = f"; it saves {x.saved_gib:.1f} GiB per GPU on {x.reference}" if x.saved_gib >= MIN_SAVED_GIB else ""
    held = f"{host_bytes / GIB:.1f} GiB of RAM per node" if host_bytes else f"{x.tokens_per_s:,.0f} tokens/s"
    return (f"{x.strategy} offloads to the CPU ({held}); {_with_change(x)} {where} at {x.remedy_step_s:.2f} s/step, "
            f"{x.remedy_tokens_per_s:,.0f} tokens/s ({x.remedy_tokens_per_s / x.tokens_per_s:.1f}x)"
            f"{_own_step(x.remedy_samples, x.samples)}{saving}.")


def _with_change(x: r.OffloadRemedy | r.HeadroomRemedy | r.SingleProcessRemedy) -> str:
    """``with --loss fused (keeps the mathematics), zero3 on mesh cp 2``: a first line's remedy and its plan."""
    kind = "keeps the mathematics" if x.keeps_math else "changes the mathematics"
    on = f" on mesh {x.remedy_mesh}" if x.remedy_mesh else ""
    return f"with {x.remedy} ({kind}), {x.remedy_strategy}{on}"


def _headroom_remedy(x: r.HeadroomRemedy) -> str:
    return (f"{x.strategy} needs {_past_the_headroom(x.total_bytes, x.capacity_bytes, x.headroom)}: within the "
            f"estimate's error of an out-of-memory failure; {_with_change(x)} needs "
            f"{x.remedy_total_gib:.2f} GiB ({x.remedy_total_gib * GIB / x.capacity_bytes:.0%}) at {_pace(x)}.")


def _single_process_remedy(x: r.SingleProcessRemedy) -> str:
    return (f"{x.strategy} (torch.nn.DataParallel: one process drives every GPU, and GPU 0 gathers the outputs and "
            f"steps the optimizer) is the only strategy that fits here; {_with_change(x)} runs on the GPUs alone at "
            f"{_pace(x)}.")


def _pace(x: r.HeadroomRemedy | r.SingleProcessRemedy) -> str:
    """``0.99 s/step, 8,297 tokens/s (1.57x)``: the remedy's plan against this one, and its own samples a step."""
    return (f"{x.remedy_step_s:.2f} s/step, {x.remedy_tokens_per_s:,.0f} tokens/s "
            f"({x.remedy_tokens_per_s / x.tokens_per_s:.2f}x){_own_step(x.remedy_samples, x.samples)}")


def _own_step(own: int | None, plan: int | None) -> str:
    """A remedy's mesh at its own micro-batch: ``, on its own 1 sample a step where this plan steps on 8``."""
    if own is None:
        return ""
    return f", on its own {own} sample{'s' if own != 1 else ''} a step where this plan steps on {plan}"


def offload_remedy_with_host(x: r.OffloadRemedy, host_bytes: int | None) -> str:
    return _offload_remedy(x, host_bytes=host_bytes)


def _remedy_fits(x: r.RemedyFits) -> str:
    on = f" on mesh {x.mesh}" if x.mesh else ""
    return (f"with {x.remedy}{'' if x.keeps_math else ' (changes the mathematics)'}, {x.strategy}{on} fits "
            f"{'on the GPUs alone' if x.fits else 'with CPU offload'}: {x.step_s:.2f} s/step, "
            f"{x.tokens_per_s:,.0f} tokens/s")


def _loss_peak(x: r.LossPeak) -> str:
    listed = " and ".join(f"--loss {s.kernel}{' would save' if i == 0 else ''} {s.saved_bytes / GIB:.1f} GiB"
                          for i, s in enumerate(x.savings))
    on = f" on mesh {x.mesh_label}" if x.mesh_label else ""
    return (f"the loss decides the peak of {x.strategy}{on} (hf loss: full logits and their fp32 copy): {listed} of its "
            f"{x.total_bytes / GIB:.1f} GiB per GPU at micro-batch {x.micro_batch_size}")


def _loss_would_fit(x: r.LossWouldFit) -> str:
    return (f"nothing fits with the hf loss (full logits and their fp32 copy); with --loss {x.kernel}, "
            f"{x.strategy} fits at micro-batch {x.micro_batch_size} ({x.total_bytes / GIB:.1f} GiB per GPU)")


def _smallest(x: r.SmallestFitFound) -> str:
    on = f" on mesh {x.gpu_only_mesh}" if x.gpu_only_mesh is not None else ""
    gpu_only = (f" Without offload, {x.gpu_only_gpus} x {x.gpu} would fit with zero3{on}"
                f"{'' if x.gpu_only_micro_batch is None else f' at micro-batch {x.gpu_only_micro_batch}'}."
                if x.gpu_only_gpus is not None else "")
    dropped = f" without {x.without}" if x.without is not None else ""
    mesh = f" on mesh {x.mesh_label}" if x.mesh_label is not None else ""
    micro = x.micro_batch_size
    if x.current:
        return f"{x.strategy} fits on these {x.num_gpus} x {x.gpu}{mesh}{dropped} at micro-batch {micro}.{gpu_only}"
    return f"{x.num_gpus} x {x.gpu} would fit with {x.strategy}{mesh}{dropped} at micro-batch {micro}.{gpu_only}"


def _longer_with_offload(x: r.LongerWithOffload) -> str:
    return (f"{x.strategy} holds {x.seq_len:,} tokens by offloading to the CPU ({x.step_s:.2f} s/step, "
            f"{x.tokens_per_s:,.0f} tokens/s there); the plan is shown at {x.gpu_only_seq_len:,}, the longest on "
            "the GPUs alone.")


def _beyond_context(x: r.BeyondContext) -> str:
    if x.learned:
        return (f"{x.seq_len:,} tokens is past the model's context of {x.context:,} tokens (max_position_embeddings): "
                f"its positions are a learned table of {x.context:,} rows, so a longer input fails (--seq-len "
                f"{x.context} stays within it).")
    return (f"{x.seq_len:,} tokens is past the model's context of {x.context:,} tokens (max_position_embeddings): "
            f"training that long needs RoPE scaling or a longer-context checkpoint (--seq-len {x.context} stays "
            "within it).")


def _longest_within_headroom(x: r.LongestWithinHeadroom) -> str:
    return (f"{x.strategy} holds {x.longest_seq_len:,} tokens only past the {x.headroom:.0%} headroom (the longest "
            f"fills the GPU); within it, {x.seq_len:,} (--seq-len {x.seq_len}).")


def _longer_with_change(x: r.LongerWithChange) -> str:
    return (f"with {x.change} (keeps the mathematics), {x.strategy} holds {x.seq_len:,} tokens, "
            f"{x.seq_len / x.plan_seq_len:.2f}x this plan's {x.plan_seq_len:,} (--seq-len max {x.change}).")


def _past_headroom(x: r.PastHeadroom) -> str:
    return (f"micro-batch {x.micro_batch_size} also fits ({_gib(x.total_bytes)} of {_gib(x.capacity_bytes)}, "
            f"{_share(x.total_bytes, x.capacity_bytes):.0%}), past the {x.headroom:.0%} headroom, and runs "
            f"{x.tokens_per_s:,.0f} tokens/s against this plan's {x.chosen_tokens_per_s:,.0f} "
            f"(--micro-batch {x.micro_batch_size}{' ' + x.flags if x.flags else ''}; within the estimate's error of an "
            f"out-of-memory failure).")


def _no_count(x: r.NoCountFits) -> str:
    tried = " (with activation checkpointing)" if x.checkpointing_tried else ""
    pinned = f" with {x.pinned}" if x.pinned is not None else ""
    room = (f"the {_gib(x.left_bytes)} of a GPU that --reserve-gib {x.reserve_gib:g} and the CUDA context leave"
            if x.reserve_gib is not None else "a GPU")
    if x.without_batch is not None:  # the batch, not the sample, is what no count holds
        return (f"No count of these GPUs above {x.above} fits{pinned} at --global-batch {x.global_batch_size} "
                f"(tried: whole nodes whose data-parallel ranks divide it, each accumulating its share, up to "
                f"{x.max_nodes} nodes, and doubling beyond); without it, {_smallest(x.without_batch)} Change "
                f"--global-batch.")
    if x.sharding_unavailable is not None:  # only the strategies that replicate the model could run
        return (f"No number of these GPUs fits: every strategy that shards the model is unavailable here "
                f"({x.sharding_unavailable}), and dp, ddp and zero1 hold every parameter and gradient on each GPU.")
    if x.bucket is not None:  # the user's DeepSpeed size, not the sample
        return (f"No number of these GPUs fits{pinned}: DeepSpeed's {x.bucket} alone takes {_gib(x.bucket_bytes)} a "
                f"buffer in 16 bits, beside the model; {' or '.join(x.hints)}.")
    if x.pinned is not None:  # the pins limited the counts and meshes tried: say what was, not why it failed
        checkpointed = ", with activation checkpointing" if x.checkpointing_tried else ""
        return (f"No count tried fits{pinned}{checkpointed} (every count within a node, then whole nodes doubling, "
                f"on the meshes that keep {x.kept or x.pinned} and data parallelism without them); "
                f"{' or '.join(x.hints)}.")
    return (f"No number of these GPUs fits: one sample's activations alone exceed {room}{tried}, or offloaded states "
            f"exceed CPU RAM; {' or '.join(x.hints)}.")


def _at_offload_samples(samples: int | None) -> str:
    return "" if samples is None else f" at the offload plan's {samples} samples a step"


def _own_samples(n: int | None, m: int | None, what: str, whose: str = "offload plan's") -> str:
    """A mesh planned at its own samples a step, not at ``whose`` ``n`` (none there ``what``)."""
    if n is None:
        return ""
    return (f" At the {whose} {n} samples a step no mesh {what} (--global-batch {n} plans at them); the mesh "
            f"steps on its own {m} sample{'s' if m != 1 else ''}.")


def _past_the_headroom(total_bytes: int, capacity_bytes: int, headroom: float) -> str:
    """``78.4 GiB of 79.2 GiB (99%), past the 10% headroom``: a plan within the estimate's error of an OOM."""
    return (f"{_gib(total_bytes)} of {_gib(capacity_bytes)} ({_share(total_bytes, capacity_bytes):.0%}), past the "
            f"{headroom:.0%} headroom")


def _dp_cannot(x: r.DataParallelCannot) -> str:
    if x.offload_strategy is None:
        return f"Data parallelism alone cannot run this: the limit is {_limit(x.limit)}."
    kept = "" if x.samples_per_step is None else (
        f" The mesh is planned at the offload plan's {x.samples_per_step} samples a step (--global-batch "
        f"{x.samples_per_step}).")
    if x.offload_samples_unfit is not None:
        kept = _own_samples(x.offload_samples_unfit, x.mesh_samples_per_step, "fits within the headroom")
    return (f"Data parallelism alone runs this only with CPU offload ({x.offload_strategy}, "
            f"{x.offload_tokens_per_s:,.0f} tokens/s); on the GPUs alone the limit is {_limit(x.limit)}.{kept}")


def _limit(x: r.Limit) -> str:
    if isinstance(x, r.NoDataParallelFits):
        return "no data-parallel strategy fits"
    if isinstance(x, r.BatchLimit):
        if x.kind == "batch-indivisible":
            return (f"the global batch: {x.global_batch_size} sample{'s' if x.global_batch_size != 1 else ''} cannot give each "
                    f"of {x.world_size} GPUs whole "
                    "micro-batches, so some GPUs must share a sample (tensor or context parallelism)")
        micro = x.micro_batch_size
        return (f"the global batch: {x.global_batch_size} samples are not a whole number of micro-steps of "
                f"micro-batch {micro} x {x.world_size} GPUs ({micro * x.world_size} samples), so fewer data-parallel "
                "ranks must take them (tensor or context parallelism)")
    ckpt = _with_ckpt(x.checkpointing)
    limit = {
        "activations-and-logits": lambda: (f"activations: {_gib(x.activations_bytes)} saved{ckpt} plus "
                                           f"{_gib(x.temporary_bytes)} of logits and loss buffers for one sample"),
        "activations": lambda: f"activations: {_gib(x.activations_bytes)} of one sample{ckpt}",
        "largest-layer": lambda: (f"the largest layer: {_gib(x.temporary_bytes)} of an unsharded block, its gradients "
                                  "and backward buffers"),
        "model-states": lambda: f"the model states: {_gib(x.states_bytes)} per GPU",
    }[x.kind]()
    return (f"{limit} (zero3 needs {_gib(x.total_bytes)} per GPU of {_gib(x.capacity_bytes)} at micro-batch "
            f"{x.micro_batch_size}, peak at {x.peak_moment.replace('_', ' ')})")


def _mesh_fits(x: r.MeshFits) -> str:
    return (f"mesh {x.mesh_label} ({x.strategy}: FSDP2 over dp_shard x cp) fits: {_gib(x.total_bytes)} of "
            f"{_gib(x.capacity_bytes)} per GPU at micro-batch {x.micro_batch_size}{_with_which_ckpt(x.checkpointing)}, "
            f"{x.step_s:.2f} s/step ({x.tokens_per_s:,.0f} tokens/s, MFU {x.mfu:.0%}).")


def _degree(x: r.DegreeEffect) -> str:
    saved = x.without_bytes - x.total_bytes
    time = ""
    if x.compare == "tokens":
        time = f", {x.tokens_per_s:,.0f} vs {x.without_tokens_per_s:,.0f} tokens/s without it"
    elif x.compare == "step":
        delta = x.step_s - x.without_step_s
        time = f", {'+' if delta >= 0 else ''}{delta:.2f} s/step ({x.without_step_s:.2f} s without it)"
    elif x.compare == "unfit":
        time = f"; without it micro-batch {x.micro_batch_size} at this checkpointing does not fit"
    verb = "saves" if saved >= 0 else "costs"
    return f"{x.dim} {x.degree} {verb} {_gib(abs(saved))} per GPU ({_gib(x.without_bytes)} without it){time}."


def _stage_peaks(x: r.StagePeaks) -> str:
    peaks = ", ".join(f"{p / GIB:.1f}" for p in x.peaks_bytes)
    worst = max(range(len(x.peaks_bytes)), key=lambda i: x.peaks_bytes[i])
    return f"per-stage peaks (GiB, rank 0 first): {peaks}; the worst, rank {worst}, decides the fit."


def _without_pp(x: r.WithoutPipeline) -> str:
    if x.fits:
        return (f"best mesh without pp/ep: {x.mesh_label}, {_gib(x.total_bytes)} per GPU, {x.step_s:.2f} s/step, "
                f"{x.tokens_per_s:,.0f} tokens/s.")
    return f"best mesh without pp/ep: none fits (the closest, {x.mesh_label}, needs {_gib(x.total_bytes)})."


def cause_text(x: r.SearchCause) -> str:
    """Why pipeline/expert meshes were searched, as the clause the lines quote."""
    if x.kind == "pinned":
        return "pipeline/expert degrees pinned"
    if x.kind == "experts":
        return (f"routed experts hold {x.expert_share:.0%} of the {x.num_params / 1e9:.1f}B parameters, so expert "
                "parallelism was searched")
    if x.kind == "no-mesh-tried":
        return "no mesh of tp, cp and HSDP inside a node was tried"
    if x.kind == "no-mesh-fits":
        return (f"no mesh of tp, cp and HSDP inside a node fits: the closest, {x.mesh_label}, needs "
                f"{_gib(x.total_bytes)} per GPU of {_gib(x.capacity_bytes)}, and TP across "
                "nodes would put its collectives on the network, so pipeline stages were searched")
    if x.kind == "low-mfu":
        return (f"the best mesh of tp, cp and HSDP, {x.mesh_label}, runs at MFU {x.mfu:.0%} with its collectives "
                "between nodes, so pipeline stages, which send only activations there, were searched")
    return "policy fastest: pipeline and expert meshes were searched too"


def _pipeline_summary(x: r.PipelineSummary) -> str:
    if x.fits:
        return (f"Pipeline/expert meshes searched ({cause_text(x.cause)}); the fastest, {x.mesh_label}, fits at "
                f"{_gib(x.total_bytes)} on its worst rank but is slower: {x.step_s:.2f} s/step, "
                f"{x.tokens_per_s:,.0f} tokens/s.")
    return (f"Pipeline/expert meshes searched ({cause_text(x.cause)}); none fits: the closest, {x.mesh_label}, needs "
            f"{_gib(x.total_bytes)} on its worst rank (rank {x.worst_rank}) of {_gib(x.capacity_bytes)}.")


def _no_gpu_only(x: r.NoGpuOnlyMesh) -> str:
    # the cause's closest tp/cp mesh is often the closest of all: the search said once, not its figures twice
    searched = ("meshes of tp, cp and HSDP inside a node, then pipeline stages, searched"
                if x.cause.kind == "no-mesh-fits" else cause_text(x.cause))
    worst = "" if x.cause.kind == "no-mesh-fits" and " pp " not in f" {x.mesh_label} " else " on its worst rank"
    return (f"No GPU-only mesh fits{_at_offload_samples(x.samples_per_step)} ({searched}): the closest, {x.mesh_label}, needs {_gib(x.total_bytes)} "
            f"per GPU of {_gib(x.capacity_bytes)}{worst} at micro-batch {x.micro_batch_size}, of which the "
            f"model states alone (parameters, gradients, optimizer) are {_gib(x.states_bytes)}.")


def _no_pinned(x: r.NoPinnedMeshFits) -> str:
    extra = (f": the closest, {x.mesh_label}, needs {_gib(x.total_bytes)} per GPU at micro-batch {x.micro_batch_size}"
             if x.mesh_label is not None else "")
    return f"No mesh with the pinned degrees fits{extra}."


def _no_mesh(x: r.NoMeshFits) -> str:
    named = list(x.tried)
    kinds = (", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else "".join(named)) + " degrees" \
        if named else "meshes"
    no_cp = "; no cp: context parallelism cannot shard a vision-language model's input_ids" if x.images else ""
    if x.unavailable:
        return f"No mesh can run it either: the {x.num_tried} meshes ({kinds}) run FSDP2, which cannot run this job here."
    return f"No mesh fits either (tried {x.num_tried}: {kinds}{no_cp})."


def _ckpt_word(mode: r.Checkpointing) -> str:
    return {"selective": "selective", "on": "full", "off": "no"}[mode]


def _fastest_mesh(x: r.FastestMesh) -> str:
    a, b = x.mesh, x.dp
    ckpt_note = ""
    if _ckpt_word(a.checkpointing) != _ckpt_word(b.checkpointing):
        ckpt_note = (f"; the mesh fits with {_ckpt_word(a.checkpointing)} checkpointing where {x.dp_strategy} "
                     f"alone needs {_ckpt_word(b.checkpointing)}")
    return (f"Policy fastest: mesh {x.mesh_label} is {a.tokens_per_s / b.tokens_per_s - 1:.0%} "
            f"faster than {x.dp_strategy} alone: {a.tokens_per_s:,.0f} vs {b.tokens_per_s:,.0f} tokens/s "
            f"({a.step_s:.2f} s/step at micro-batch {a.micro_batch_size} vs {b.step_s:.2f} s at "
            f"{b.micro_batch_size}; {_gib(a.total_bytes)} vs {_gib(b.total_bytes)} "
            f"per GPU; exposed communication {a.exposed_communication_s:.2f} vs {b.exposed_communication_s:.2f} s"
            f"{ckpt_note}).{_own_samples(x.offload_samples_unfit, x.mesh_samples_per_step, 'is faster')}")


def _mesh_within_headroom(x: r.MeshWithinHeadroom) -> str:
    a, b = x.mesh, x.dp
    own = _own_samples(x.dp_samples_unfit, x.mesh_samples_per_step, "fits within the headroom", "data-parallel plan's")
    return (f"{x.dp_strategy} alone needs {_past_the_headroom(b.total_bytes, x.capacity_bytes, x.headroom)} (within the "
            f"estimate's error of an out-of-memory failure); mesh {x.mesh_label} runs within it: {_gib(a.total_bytes)} "
            f"({_share(a.total_bytes, x.capacity_bytes):.0%}), {a.tokens_per_s:,.0f} vs {b.tokens_per_s:,.0f} tokens/s "
            f"({a.step_s:.2f} s/step at micro-batch {a.micro_batch_size} vs {b.step_s:.2f} s at {b.micro_batch_size}).{own}")


def _mesh_over_slow(x: r.MeshOverSlowDataParallel) -> str:
    a, b = x.mesh, x.dp
    return (f"{x.dp_strategy} alone runs at MFU {x.dp_mfu:.0%} on {x.nodes} nodes ({b.tokens_per_s:,.0f} tokens/s, "
            f"{b.exposed_communication_s:.2f} s of its {b.step_s:.2f} s step in exposed communication); mesh "
            f"{x.mesh_label} runs {a.tokens_per_s:,.0f} tokens/s ({a.tokens_per_s / b.tokens_per_s:.2f}x) within the "
            f"headroom: {_gib(a.total_bytes)} ({_share(a.total_bytes, x.capacity_bytes):.0%}).")


def _dp_also_fits(x: r.DataParallelAlsoFits) -> str:
    return (f"{x.strategy} alone (data parallelism over all {x.world_size} GPUs) also fits: "
            f"{_gib(x.total_bytes)} per GPU, {x.step_s:.2f} s/step at micro-batch "
            f"{x.micro_batch_size}, {x.tokens_per_s:,.0f} tokens/s.")


# Keyed by class name, not class: naming every class here would import the mesh reasons on every plan
# (advisor.planning.reasons loads them on first use).
_RENDER: dict[str, Callable] = {
    "SizeDefault": lambda x: (f"Default on one GPU: {x.strategy} ({size_rationale(x)})." if x.band == "one-gpu"
                              else f"Default from size: {x.strategy} ({size_rationale(x)})."),
    "SizeDefaultUnfit": lambda x: f"The size default {x.strategy} ({size_rationale(x)}) does not fit.",
    "AlsoSizeDefault": lambda x: f"It is also the size default ({size_rationale(x)}).",
    "DefaultFits": _default_fits,
    "DoesNotFit": _does_not_fit,
    "HighEndDoesNotFit": _high_end,
    "CpuRamDoesNotFit": lambda x: (f"{x.strategy} does not fit in CPU RAM: needs {_gib(x.cpu_bytes)} per node "
                                   f"of {_gib(x.cpu_capacity_bytes)}."),
    "Unavailable": lambda x: f"{x.strategy} is unavailable: {x.detail}.",
    "Escalated": _escalated,
    "FasterOffload": _faster_offload,
    "OffloadNotTaken": _offload_not_taken,
    "MarginChoice": _margin,
    "Dominates": _dominates,
    "CpuRam": _cpu_ram,
    "CheckpointingOn": _checkpointing_on,
    "CheckpointingForHeadroom": _checkpointing_for_headroom,
    "AlsoFits": _also_fits,
    "Requested": lambda x: f"{x.strategy} was requested; it fits.",
    "FastestPolicy": _fastest,
    "Tradeoff": _tradeoff,
    "OffloadRemedy": _offload_remedy,
    "HeadroomRemedy": _headroom_remedy,
    "SingleProcessRemedy": _single_process_remedy,
    "RemedyFits": _remedy_fits,
    "LossPeak": _loss_peak,
    "LossWouldFit": _loss_would_fit,
    "SmallestFitFound": _smallest,
    "LongerWithOffload": _longer_with_offload,
    "LongerWithChange": _longer_with_change,
    "BeyondContext": _beyond_context,
    "LongestWithinHeadroom": _longest_within_headroom,
    "PastHeadroom": _past_headroom,
    "NoCountFits": _no_count,
    "DataParallelCannot": _dp_cannot,
    "MeshFits": _mesh_fits,
    "DegreeEffect": _degree,
    "StagePeaks": _stage_peaks,
    "WithoutPipeline": _without_pp,
    "PipelineSearched": lambda x: f"Pipeline/expert meshes searched: {cause_text(x.cause)}.",
    "PipelineSummary": _pipeline_summary,
    "NoGpuOnlyMesh": _no_gpu_only,
    "PinnedDegrees": lambda x: f"Pinned degrees: {', '.join(f'--{flag} {value}' for flag, value in x.flags)}.",
    "NoPinnedMeshFits": _no_pinned,
    "NoMeshFits": _no_mesh,
    "OffloadKeptOverMesh": lambda x: (
        f"zero3 on mesh {x.mesh_label} fits on the GPUs alone only past the {x.headroom:.0%} headroom "
        f"({_gib(x.total_bytes)} of {_gib(x.capacity_bytes)}, {x.total_bytes / x.capacity_bytes:.0%}"
        f"{_at_offload_samples(x.samples_per_step)}), at "
        f"{x.tokens_per_s:,.0f} tokens/s against {x.offload_strategy}'s {x.offload_tokens_per_s:,.0f}: the offload is "
        f"kept{'; --policy fastest takes the mesh' if x.fastest_takes_mesh else ''}."),
    "MeshSlowerThanOffload": lambda x: (
        f"zero3 on mesh {x.mesh_label} runs {1 - x.tokens_per_s / x.offload_tokens_per_s:.0%} slower than "
        f"{x.offload_strategy} ({x.tokens_per_s:,.0f} against {x.offload_tokens_per_s:,.0f} tokens/s), and is taken "
        "because it fits on the GPUs alone within the headroom; --policy fastest "
        f"{'keeps the offload' if x.fastest_mesh_label is None else f'takes mesh {x.fastest_mesh_label}'}."),
    "MeshNotFaster": lambda x: (f"The fastest mesh, {x.mesh_label}, is not faster by more than {x.same_speed:.0%}: "
                                f"{x.tokens_per_s:,.0f} vs {x.dp_tokens_per_s:,.0f} tokens/s."),
    "FastestMesh": _fastest_mesh,
    "MeshWithinHeadroom": _mesh_within_headroom,
    "MeshOverSlowDataParallel": _mesh_over_slow,
    "DataParallelAlsoFits": _dp_also_fits,
}


def render(reason: r.Reason) -> str:
    """The sentence for one reason, as ``Plan.why`` lists it."""
    return _RENDER[type(reason).__name__](reason)


def render_reason(reasons: tuple[r.Reason, ...]) -> str:
    """``Recommendation.reason``: its reasons' sentences joined (a requested strategy says it in short)."""
    return " ".join(f"{x.strategy} was requested and fits" if isinstance(x, r.Requested) else render(x)
                    for x in reasons)


def render_alternative(reason: r.Reason) -> str:
    """One of ``Recommendation.alternatives``: the sentence without its full stop."""
    return render(reason).removesuffix(".")


def remedy_line(remedy) -> str:
    """``--loss fused: saves 2.2 GiB per GPU; then zero3 on the GPUs alone, 1.03 s/step, 11,942 tokens/s``."""
    if remedy.saved_gib >= MIN_SAVED_GIB:
        memory = f"saves {remedy.saved_gib:.1f} GiB per GPU"
    elif remedy.saved_gib <= -MIN_SAVED_GIB:
        memory = f"uses {-remedy.saved_gib:.1f} GiB more per GPU"
    else:
        memory = "same memory"
    if remedy.strategy is None:
        return f"{remedy.name}: {memory}; still nothing fits"
    where = "on the GPUs alone" if remedy.fits else "with CPU offload"
    if remedy.mesh is not None:
        where = f"on mesh {remedy.mesh}" + ("" if remedy.fits else " with CPU offload")
    # the saving is on the reference at its micro-batch and checkpointing (remedy_basis); the plan it leads to picks
    # its own, so its own total is said too
    total = f" at {remedy.total_gib:.2f} GiB" if remedy.total_gib is not None else ""
    past = (" (past the headroom: within the estimate's error of an out-of-memory failure)"
            if remedy.past_headroom else "")
    return (f"{remedy.name}: {memory}; then {remedy.strategy} {where}{total}{past}, {remedy.step_s:.2f} s/step, "
            f"{remedy.tokens_per_s:,.0f} tokens/s{_own_step(remedy.own_samples, remedy.plan_samples)}")


def remedy_basis(remedies) -> str:
    """What a remedy's "saves" is measured on, said once above a list of remedy_line's."""
    reference = next((x.reference for x in remedies if x.reference), None)
    on = f"on {reference} at its" if reference else "at the"
    return f"a saving is {on} micro-batch and checkpointing; the plan after it picks its own"


def remedy_sections(remedies) -> list[tuple[str, list[str]]]:
    """The remedies in two groups, as the planner ranked them: those that keep the mathematics, then the others."""
    groups = [("Remedies that keep the mathematics", [x for x in remedies if x.keeps_math]),
              ("Remedies that change the mathematics", [x for x in remedies if not x.keeps_math])]
    return [(header, [remedy_line(x) for x in group]) for header, group in groups if group]


# Reasons that only give a candidate's fit figures, which the answer line already prints.
_FIT_FIGURES = ("DefaultFits", "MeshFits", "Escalated")


def headline_reason(plan) -> str:
    """One line of why (``advisor plan``'s answer and ``advisor compare``'s message), picked by kind among the
    planner's reasons (``plan``: a ``Plan`` with a recommendation). An offloading plan: the best remedy in
    numbers. A --seq-len max past the model's context: that; one that fills the GPU past the --headroom: the
    longest within it, and the longest with the change that keeps the mathematics (``LongerWithChange``). On a mesh: the reason that opens its case (what forced a mesh, or the policy that chose it).
    Otherwise the first of the recommendation's reasons that does more than give a candidate's fit
    figures (``zero3 does not fit: needs 79.6 GiB``, ``zero2 rather than zero3: ...``); when all do (the
    size default fits), the first reason."""
    rec = plan.recommendation
    if rec.remedies and rec.strategy.endswith("_offload") and plan.reasons:
        # an offloading plan's first reason names the best remedy in numbers, with the host RAM the plan holds
        first, chosen = plan.reasons[0], plan.chosen
        if type(first).__name__ == "OffloadRemedy" and chosen is not None:
            return offload_remedy_with_host(first, chosen.cpu_memory_bytes)
        return render(first)
    if plan.reasons and type(plan.reasons[0]).__name__ in ("BeyondContext", "HeadroomRemedy", "SingleProcessRemedy"):
        return render(plan.reasons[0])  # a length past the model's context: that first
    roomy = next((x for x in plan.reasons if type(x).__name__ == "LongestWithinHeadroom"), None)
    longer = next((x for x in plan.reasons if type(x).__name__ == "LongerWithChange"), None)
    if roomy is not None or longer is not None:  # --seq-len max fills the GPU: the longest within the --headroom
        # next, and how much longer the change that keeps the mathematics runs
        first = render(roomy) if roomy is not None else ""
        change = render(longer) if longer is not None else ""
        return f"{first} {change[:1].upper()}{change[1:]}" if first and change else first or change
    if rec.mesh is not None:
        opened = [i for i, x in enumerate(plan.reasons) if type(x).__name__ == "MeshFits"]
        if opened and opened[0] > 0:
            return render(plan.reasons[opened[0] - 1])
    picked = next((x for x in rec.reasons if type(x).__name__ not in _FIT_FIGURES), None)
    if picked is not None:
        return render_reason((picked,))
    return plan.why[0] if plan.why else rec.reason
