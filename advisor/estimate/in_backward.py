"""Two ways a stack keeps the optimizer off the peak: the step run inside backward (torchtune's
``optimizer_in_bwd``) and bitsandbytes' paged optimizer state. Pure: no torch import. What belongs here: the
model states and placement these two change, the rule of where they can run, and the plan's notes about
them; the moments themselves stay in ``advisor.estimate.memory`` and ``strategy_buffers``.

Optimizer in backward (``TrainingConfig.optimizer_in_backward``), read from torchtune at commit
bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1: ``torchtune/training/memory.py`` ``register_optim_in_bwd_hooks``
registers on every trainable parameter a post-accumulate-grad hook that calls ``optim_dict[param].step()``
then ``optim_dict[param].zero_grad()`` (one optimizer per parameter, ``create_optim_in_bwd_wrapper``), so a
gradient is freed as soon as it is accumulated: no full gradient buffer exists, and the step's temporaries
are one parameter's. ``recipes/full_finetune_single_device.py`` (lines 151-160) refuses it with
``gradient_accumulation_steps > 1`` (and with gradient clipping). ``recipes/full_finetune_distributed.py``
runs it under FSDP2 too (lines 208-231, 746-790); that is not modelled here: one GPU only.

Paged optimizer (``--optimizer adamw-8bit-paged``, ``bitsandbytes.optim.PagedAdamW8bit``), read from
bitsandbytes at commit 95f9af309d4d5793847169c39288dcd3fcbdf564: ``bitsandbytes/optim/optimizer.py``
``get_state_buffer`` allocates a state of a parameter of at least 1e5 elements with ``F.get_paged``
(``bitsandbytes/functional.py``), which calls ``cget_managed_ptr`` (``csrc/pythonInterface.cpp``:
``cudaMallocManaged(..., cudaMemAttachHost)``): unified memory outside PyTorch's caching allocator, which the
driver migrates to the GPU on use and evicts to CPU RAM under memory pressure. ``step`` calls
``prefetch_state`` (``cudaMemPrefetchAsync`` to the GPU) before each parameter's update and ``sync_gpu``
after it. The fp32 absmax of each 8-bit state (``state["absmax1"]``, ``["absmax2"]``) is a plain
``torch.zeros`` on the device, and smaller parameters keep plain device states.
"""

from __future__ import annotations

from advisor.frozen import validated_copy
from advisor.estimate.memory import cached_within
from advisor.estimate.states import ModelStates, largest_trainable_params, optimizer_step_temporary
from advisor.model.spec import ModelSpec
from advisor.training import TrainingConfig
from advisor.units import GIB

PAGED_OPTIMIZERS = ("adamw-8bit-paged",)


def in_backward_problem(training: TrainingConfig, *, world: int) -> str | None:
    """Why ``--optimizer-in-backward`` cannot be planned here (a one-line reason), or None."""
    if not training.optimizer_in_backward:
        return None
    if world > 1:
        return (f"--optimizer-in-backward is modelled on one GPU only (torchtune's single-device recipe), not "
                f"{world} GPUs")
    micro, total = training.micro_batch_size, training.global_batch_size
    if micro is not None and total is not None and total != micro:
        return (f"--optimizer-in-backward steps in backward and cannot accumulate gradients: --global-batch {total} "
                f"needs --micro-batch {total}, not {micro}")
    if training.engine != "torch":
        return f"--optimizer-in-backward runs on the torch engine (torchtune), not --engine {training.engine}"
    return None


def in_backward_states(spec: ModelSpec, training: TrainingConfig, states: ModelStates) -> ModelStates:
    """One GPU's states when each parameter is stepped in its post-accumulate-grad hook: at most one
    gradient exists at a time, the largest trainable tensor's (``largest_trainable_params``), and the step's
    temporaries are one parameter's (a foreach step over one tensor allocates its square root, a for-loop
    step two of them; the fused and 8-bit steps none: ``states.optimizer_step_temporary``)."""
    largest = training.param_bytes * largest_trainable_params(spec, training)
    temp = optimizer_step_temporary(training, trainable_bytes=largest, largest_bytes=largest,
                                    element_bytes=training.param_bytes)
    return validated_copy(states, {"grads": largest, "step_temporary": temp})


def paged_state_bytes(spec: ModelSpec, training: TrainingConfig) -> int:
    """Bytes of optimizer state bitsandbytes allocates in managed memory: both 8-bit moments of the trainable
    parameters (1 byte each). The parameters under 1e5 elements (norms, biases) whose states stay on the
    device are counted as paged too: a few MB of a billion-parameter model (an approximation)."""
    if training.optimizer not in PAGED_OPTIMIZERS:
        return 0
    return 2 * spec.trainable_params


def place_paged_state(memory, paged_bytes: int, *, capacity_bytes: int):
    """``memory`` (a ``MemoryBreakdown`` whose peak leaves the paged state out) with the state placed: on the
    GPU when the total with it still fits the GPU's memory (outside the caching allocator: in
    ``outside_allocator``, not in ``peak_allocated`` nor ``reserved``, as ``torch.cuda`` does not see it), else
    evicted to CPU RAM by the driver (``cpu_bytes`` and ``paged_on_cpu``), where the step fetches it over PCIe
    (``advisor.estimate.step_time``). An assumption: the driver keeps the whole state resident when it fits,
    and evicts all of it when it does not."""
    if not paged_bytes:
        return memory
    if memory.total + paged_bytes <= capacity_bytes:
        # the allocator's cached blocks (FSDP's gradient pool, the recompute cache) fit in what the state leaves
        cache, pool, recompute = cached_within(capacity_bytes - memory.total - paged_bytes,
                                               cache=memory.allocator_cache, pool=memory.gradient_stream_pool,
                                               recompute=memory.recompute_cache)
        return validated_copy(memory, {"runtime_overhead": memory.runtime_overhead + paged_bytes,
                                         "outside_allocator": memory.outside_allocator + paged_bytes,
                                         "allocator_cache": cache, "gradient_stream_pool": pool,
                                         "recompute_cache": recompute})
    return validated_copy(memory, {"cpu_bytes": memory.cpu_bytes + paged_bytes, "paged_on_cpu": paged_bytes})


def optimizer_notes(training: TrainingConfig) -> list[str]:
    """The plan's assumptions about these two (empty for every plan that uses neither)."""
    notes = []
    if training.optimizer_in_backward:
        notes.append("optimizer in backward (torchtune's optimizer_in_bwd): each parameter is stepped in its "
                     "post-accumulate-grad hook and its gradient freed, so at most the largest parameter's gradient "
                     "and one parameter's step temporaries exist; the step's time is the full step's (same bytes), "
                     "not overlapped with backward; one GPU, no gradient accumulation")
    if training.optimizer in PAGED_OPTIMIZERS:
        notes.append("paged 8-bit AdamW (bitsandbytes PagedAdamW8bit): both 8-bit moments live in CUDA managed "
                     "memory, outside the caching allocator; assumed resident on the GPU when the plan's total with "
                     "them fits its memory, else evicted to CPU RAM and moved in and out over PCIe every step "
                     "(2 x the state, not overlapped: bitsandbytes syncs after each parameter's update); an "
                     "assumption, not measured")
    return notes


def paged_traffic_note(paged_on_cpu: int, seconds: float) -> str:
    return (f"paged optimizer state evicted to CPU RAM ({paged_on_cpu / GIB:.2f} GiB): {seconds:.2f} s of PCIe "
            "traffic a step (evicted and fetched back at once over the full-duplex link, not hidden behind compute; "
            "an assumption)")
