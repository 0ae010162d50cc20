"""Measuring a simulated step: PyTorch's own memory tracker, read into our breakdown, and ``LiveBytes``,
a counter of live tensor storage op by op where the tracker cannot follow the step.

What belongs here: which tracker a strategy's step gets, the tracker categories mapped to
``MemoryBreakdown``'s (params, grads, optimizer, activations, temporary), the modules with the
highest peaks. What does not: running the step (``advisor.simulate.step``, ``mesh_step``,
``pipeline_stage``, ``moe_layer``).

Imports torch (lazily); the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.simulate.model import unique_params
from advisor.strategies import Implementation


class ModulePeak(BaseModel):
    """One module's own peak during the measured step (``SimulatedStep.top_modules``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Module path in the model.")
    phase: Literal["forward", "backward"] = Field(description="When its peak happened.")
    peak_bytes: int = Field(description="All live memory at the module's own peak.")


# Tracker categories (``_MemRefType`` / ``_FSDPRefType`` values) -> our breakdown.
_CATEGORY = {
    "Parameter": "params", "Sharded Param": "params", "Buffer": "params",
    "Gradient": "grads", "Sharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Inputs": "activations", "Other": "activations",
    "Temp": "temporary", "Unsharded Param": "temporary", "Unsharded Grad": "temporary",
    "All Gather": "temporary", "Reduce Scatter": "temporary",
}


def build_tracker(net: Any, opt: Any, ids: Any, impl: Implementation) -> Any:
    """PyTorch's tracker for the step: ``MemTracker`` for a replicated model, ``FSDPMemTracker`` under FSDP2."""
    if not impl.shard_params:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = fast_peaks(MemTracker())
        tracker.track_external(net, opt, ids)
        return tracker
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker = fast_peaks(FSDPMemTracker(net, opt))
    tracker.track_inputs((ids,))
    return tracker


def fast_peaks(tracker: Any) -> Any:
    """``tracker`` with torch's per-op peak update made without dereferencing every tracked module. torch's
    ``MemTracker._update_peak_stats`` (2.13) walks its weak dictionary of module stats on every op, and each step of
    that walk asks the module ``hasattr(_fix_weakref)`` (a failed ``nn.Module.__getattr__``, twice through a
    checkpoint wrapper): a fifth of a simulated FSDP step's time. Here the walk reads each entry's name first and
    dereferences only the entries of running modules; the same entries are updated in the same way (an entry whose
    module is gone is skipped, as torch's walk skips it). A tracker without those attributes is left as it is."""
    if not all(hasattr(tracker, name) for name in ("memory_tracking", "_mod_tracker", "_curr_mem_snap", "_peak_mem",
                                                   "_peak_mem_snap", "_update_peak_stats")) \
            or not isinstance(getattr(tracker.memory_tracking, "data", None), dict):
        return tracker
    from copy import deepcopy

    def update_peak_stats(peak_state: Any) -> None:
        snap = tracker._curr_mem_snap
        parents = tracker._mod_tracker.parents
        for ref, stats in list(tracker.memory_tracking.data.items()):
            if stats.mod_fqn in parents and peak_state in stats.snapshots and ref() is not None:
                for dev, dev_snap in snap.items():
                    if stats.local_peak.get(dev, 0) < dev_snap["Total"]:
                        stats.local_peak[dev] = dev_snap["Total"]
                        stats.snapshots[peak_state][-1][dev] = deepcopy(dev_snap)
        for dev, dev_snap in snap.items():
            if tracker._peak_mem.get(dev, 0) < dev_snap["Total"]:
                tracker._peak_mem[dev] = dev_snap["Total"]
                tracker._peak_mem_snap[dev] = deepcopy(dev_snap)

    tracker._update_peak_stats = update_peak_stats
    return tracker


class _NoHook:
    def remove(self) -> None:
        pass


def skip_frozen_grad_hooks(tracker: Any, net: Any) -> None:
    """``MemTracker`` (torch 2.13) registers a gradient hook on every parameter of a module it enters,
    which raises for a frozen one (LoRA, ``--trainable-params``). Marking the frozen ones as already
    hooked (with handles whose ``remove`` does nothing) makes it skip them; they get no gradient."""
    handles = getattr(tracker, "_param_to_grad_hook_handles", None)
    if handles is None:
        return
    for param in unique_params(net):
        if not param.requires_grad:
            handles[param] = (_NoHook(), _NoHook())


@contextlib.contextmanager
def dora_weight_unhooked() -> Iterator[None]:
    """Run PEFT's DoRA weight product (``DoraLinearLayer.get_lora_weight``: ``lora_B(lora_A(eye))``, peft
    0.21 ``tuners/lora/dora.py``) without the global module hooks that ``MemTracker``'s ``ModTracker`` adds.

    The product is detached before use (DoRA paper section 4.3: the norm is a constant), so no backward ever
    runs through its graph, which a training step frees with the layer's frame: the fan_in x fan_in identity
    and ``eye A`` that lora_A's node saved. ModTracker registers a multi-gradient hook on lora_A's and lora_B's
    tensors (``torch.autograd.graph.register_multi_grad_hook``), whose closure holds the nodes that hold the
    hook: a reference cycle, so under the tracker that graph lives until Python's collector runs, and the
    measured peak moved with the collector's timing. A Falcon h384 (pure bf16, DoRA r16 on all its linears,
    s 256, two blocks): 51,716,128 bytes with the hooks left out, 52.0 to 57.6 MB with them (60,473,044 with
    the collector off: the identities of dense_4h_to_h, 1536 x 1536 bf16 = 4,718,592 bytes a block, and of
    the three 384-wide linears); the estimate, from the traced profile, 51,713,568. The layer's own hooks
    (FSDP's, the checkpoint wrapper's live on the block) still run."""
    try:
        from peft.tuners.lora.dora import DoraLinearLayer
    except ImportError:  # no PEFT: no DoRA layer to run
        yield
        return
    import torch.nn.modules.module as nn_module

    original = DoraLinearLayer.get_lora_weight

    def get_lora_weight(self: Any, *args: Any, **kwargs: Any) -> Any:
        pre, post = nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks
        nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks = OrderedDict(), OrderedDict()
        try:
            return original(self, *args, **kwargs)
        finally:
            nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks = pre, post

    DoraLinearLayer.get_lora_weight = get_lora_weight
    try:
        yield
    finally:
        DoraLinearLayer.get_lora_weight = original


def live_bytes(tracker: Any) -> dict[str, int]:
    """The tracker's live bytes now, by our category."""
    return _by_category(tracker.get_tracker_snapshot("current"))


def peak_total(tracker: Any) -> int:
    """The tracker's peak so far, all categories and devices."""
    return sum(snap.get("Total", 0) for snap in tracker.get_tracker_snapshot("peak").values())


def breakdown(tracker: Any) -> dict[str, int]:
    """The tracker's peak by our category (``SimulatedStep``'s fields)."""
    return _by_category(tracker.get_tracker_snapshot("peak"))


def _by_category(snapshot: dict) -> dict[str, int]:
    out = dict.fromkeys(("params", "grads", "optimizer", "activations", "temporary"), 0)
    for snap in snapshot.values():
        for key, value in snap.items():
            if key != "Total":
                out[_CATEGORY[str(getattr(key, "value", key))]] += value
    return out


def top_modules(tracker: Any, count: int = 5) -> tuple[ModulePeak, ...]:
    """Modules below the root with the highest memory at their own peak."""
    rows = []
    for stats in tracker.memory_tracking.values():
        if "." not in stats.mod_fqn:  # the root holds the global peak by definition
            continue
        for state, phase in (("Peak-Forward", "forward"), ("Peak Forward", "forward"),
                             ("Peak-Backward", "backward"), ("Peak Backward", "backward")):
            for snap in _snapshots(stats, state):
                total = sum(dev.get("Total", 0) for dev in snap.values())
                rows.append(ModulePeak(name=_clean_fqn(stats.mod_fqn), phase=phase, peak_bytes=total))
    rows.sort(key=lambda r: (-r.peak_bytes, r.name))
    seen: set[str] = set()
    top = []
    for row in rows:
        if row.name not in seen:
            seen.add(row.name)
            top.append(row)
    return tuple(top[:count])


def _snapshots(stats: Any, state_value: str) -> list:
    return next((snaps for state, snaps in stats.snapshots.items() if state.value == state_value), [])


def _clean_fqn(fqn: str) -> str:
    return fqn.replace("._checkpoint_wrapped_module", "").removeprefix("Global.")


class DispatchObserver:
    """A context that hands every op's output tensors to ``observe`` (a ``TorchDispatchMode``): the memory
    counters below and ``advisor.simulate.fsdp1_step.FlatLiveBytes`` count what those tensors keep."""

    def observe(self, tensors: list) -> None:
        raise NotImplementedError

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                outer.observe(tree_leaves(out))
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


class LiveBytes(DispatchObserver):
    """Live tensor storage bytes, op by op (a ``TorchDispatchMode``), and their peak split by category.

    Not ``MemTracker``: its module hooks (``ModTracker``) keep a module's leaf arguments and the
    gradients reaching a root module's outputs alive (torch 2.13), and it refuses a root module called
    twice in a step, which a pipeline stage does once per micro-batch. Storages are counted once (views
    share them) and forgotten when Python frees them (a weak reference per storage, as MemTracker does).
    """

    def __init__(self, params: list, opt: Any) -> None:
        self.params, self.opt = params, opt
        self.sizes: dict[int, int] = {}
        self.total = self.peak = 0
        self.at_peak = {"params": 0, "grads": 0, "optimizer": 0}
        self._refs: dict[int, Any] = {}
        self._param_storages = self._storages(params)
        states = [t for state in opt.state.values() for t in state.values()] if opt is not None else []
        self._opt_storages = self._storages(states)
        self.track_existing(params)
        self.track_existing(states)

    @staticmethod
    def _storages(tensors: Any) -> dict[int, int]:
        import torch

        out: dict[int, int] = {}
        for t in tensors:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                out[st._cdata] = st.nbytes()
        return out

    def track_existing(self, tensors: Any) -> None:
        import torch

        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())

    def _track(self, st: Any) -> None:
        key = st._cdata
        if key in self.sizes:
            return
        self.sizes[key] = st.nbytes()
        self.total += self.sizes[key]
        self._refs[key] = weakref.ref(st, lambda _, key=key: self._free(key))
        if self.total > self.peak:
            self.peak = self.total
            grads = self._storages(p.grad for p in self.params if p.grad is not None)
            self.at_peak = {"params": sum(self._param_storages.values()), "grads": sum(grads.values()),
                            "optimizer": sum(self._opt_storages.values())}

    def _free(self, key: int) -> None:
        self.total -= self.sizes.pop(key, 0)
        self._refs.pop(key, None)

    def breakdown(self) -> dict[str, int]:
        states = sum(self.at_peak.values())
        return {**self.at_peak, "activations": self.peak - states, "temporary": 0}

    def observe(self, tensors: list) -> None:
        self.track_existing(tensors)
