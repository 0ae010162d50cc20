"""Trace a model's activation memory on fake tensors: the ``BlockProfile`` of a family with no formula.

``trace_profile(cfg, key)`` builds the model with two blocks on the meta device, gives it fake
tensors (``FakeTensorMode``: shapes and dtypes, no storage) in the recipe's dtypes (bf16 weights, or
fp32 weights under autocast with CUDA's fp32 op list, as ``advisor.estimate.memory.recipe_dtypes``
says), wraps its blocks for checkpointing when asked, and runs forward, loss and backward at
micro-batch 1 and 2; the one-block points are derived from those steps (``one_block_less``), which
halves the traced steps of a cold plan (benchmarks/results/trace_speed.md). A ``TorchDispatchMode``
logs every storage each op creates and, through a weak reference, when it dies; parameters (made
before the trace), their gradients and
autocast's copies of them are left out, because the memory model counts those with the strategy.
Replaying the log gives the live bytes at the moments ``advisor.estimate.memory`` composes: the peak
of forward, the peak of the loss backward, the bytes live when the top block's backward begins (less
its incoming gradient: what every block saved) and the peak of the blocks' backward. One block's
saved tensors are counted with ``torch.autograd.graph.saved_tensors_hooks`` (storages once).

A LoRA / DoRA key (``ProfileKey.adapters``) traces the model with PEFT's own adapters on the frozen
base, added as the simulator adds them; the base in bf16 and the adapters in fp32 where the recipe holds
the base in the compute dtype (autocast over a bf16 residual).

The same context as the simulator (``advisor.simulate.step``): no attention dropout, CUDA's fused
dropout, CUDA's autocast fp32 list, CUDA's SDPA kernel (``cuda_kernels.cuda_sdpa``: math for fp32
grouped-query attention), the product CUDA's softmax backward holds (``cuda_kernels.cuda_softmax_backward``),
no packed-sequence detection. Imports torch; the planning path
calls it only for a family without a formula. Profiles are cached as JSON (``profile_cache``).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from advisor.frozen import validated_copy
from advisor.model.block_profile import AdapterKey, Bilinear, BlockProfile, ProfileKey
from advisor.model.config_keys import CONFIG_KEYS

# Config keys that list one entry per layer (Gemma 3's sliding/full attention pattern, ...).
PER_LAYER_LISTS = ("layer_types", "block_types")


def with_layers(cfg: dict, num_layers: int) -> dict:
    """``cfg`` with ``num_layers`` blocks (per-layer lists cut to match)."""
    out = dict(cfg)
    keys = [k for k in CONFIG_KEYS["num_layers"] if k in cfg] or ["num_hidden_layers"]
    for key in keys:
        out[key] = num_layers
    for key in PER_LAYER_LISTS:
        if isinstance(cfg.get(key), list):
            out[key] = cfg[key][:num_layers]
    return out


class _LiveLog:
    """A dispatch mode logging (uid, +bytes) when an op creates a storage and (uid, -bytes) when the
    storage dies; the uids of autocast's copies of parameters are remembered to be left out."""

    def __init__(self, param_storages: set[int]) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                log.record(func, args, out)
                return out

        self.mode = Mode()
        self.params = param_storages
        self.events: list[tuple[int, int]] = []
        self.marks: dict[str, int] = {}
        self.uids: dict[int, int] = {}
        self.casts: set[int] = set()
        self.incoming = 0  # bytes of the gradient that reaches the last block's output
        self.top_input: int | None = None  # uids of the top block's hidden-state input and output
        self.top_output: int | None = None

    def record(self, func: Any, args: tuple, out: Any) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        is_cast = func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor) and \
            args[0].untyped_storage()._cdata in self.params
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                uid = self.track(t)
                if uid is not None and is_cast:
                    self.casts.add(uid)

    def track(self, t: Any) -> int | None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.params or key in self.uids:
            return None
        uid = len(self.events)
        nbytes = st.nbytes()
        self.uids[key] = uid
        self.events.append((uid, nbytes))
        weakref.finalize(st, self._free, key, uid, nbytes)
        return uid

    def _free(self, key: int, uid: int, nbytes: int) -> None:
        self.uids.pop(key, None)
        self.events.append((uid, -nbytes))

    def uid_of(self, t: Any) -> int | None:
        return self.uids.get(t.untyped_storage()._cdata)

    def mark(self, name: str) -> None:
        self.marks[name] = len(self.events)

    def mark_once(self, name: str) -> None:
        """Remember this moment the first time only (a checkpointed block runs its forward again)."""
        self.marks.setdefault(name, len(self.events))

    def replay(self, left_out: set[int]) -> dict[str, int]:
        """Peak live bytes of each phase, the live bytes at the block-backward mark, and for
        ``one_block_less``: what the top block adds there (``top_block``), the peak of the blocks'
        backward while the top block runs it (``blocks_top``) and the live bytes where every block is done
        (``blocks_bottom``). The blocks' backward (``blocks``) ends when the gradient reaches the bottom
        block's input; what follows (the embedding's backward, where a tied head's gradient waits beside
        the embedding's) is the estimate's end of backward, counted there. Without that mark (a frozen
        embedding: no gradient reaches the bottom block's input) it runs to the end of the step."""
        levels = [0]  # levels[k]: live bytes after the first k events
        for uid, delta in self.events:
            levels.append(levels[-1] + (0 if uid in left_out else delta))
        forward_end, backward, n = self.marks["forward_end"], self.marks["blocks_backward"], len(self.events)
        alive: dict[int, int] = {}
        for uid, delta in self.events[:backward]:
            if uid not in left_out:
                alive[uid] = alive.get(uid, 0) + delta
        top_done, bottom = self.marks.get("top_backward_end", n), self.marks.get("bottom_start", n)
        return {"forward": max(levels[:forward_end + 1]), "loss": max(levels[forward_end:backward + 1]),
                "at_blocks": levels[backward], "blocks": max(levels[backward:bottom + 1]),
                "blocks_top": max(levels[backward:top_done + 1]), "blocks_bottom": levels[bottom],
                "top_block": self._top_block({uid: b for uid, b in alive.items() if b > 0})}

    def _top_block(self, alive: dict[int, int]) -> int:
        """Bytes live at the block-backward mark that a step with one block less would not hold: the storages
        the top block's forward created (uids are event positions), less its output, which plays the part
        the block below's output plays with one block less, plus that input of the top block if something
        (the top block itself) still holds it."""
        start, end = self.marks["top_start"], self.marks["top_end"]
        made = sum(n for uid, n in alive.items() if start <= uid < end and uid != self.top_output)
        return made + alive.get(self.top_input, 0)


def _build(cfg: dict, key: ProfileKey, num_layers: int) -> Any:
    """The model on the meta device, built outside the fake mode as the simulator builds it (some
    modeling code makes meta tensors at build time, which a fake mode refuses), with its loss kernel
    and checkpointing; ``materialize`` then gives it fake storage."""
    from advisor.model.meta import build_meta_model
    from advisor.simulate.model import simulation_config
    from wrappers.blocks import find_blocks
    from wrappers.checkpointing import apply_activation_checkpointing
    from wrappers.losses import use_loss_kernel

    net = build_meta_model(simulation_config(with_layers(cfg, num_layers), attention=key.attention))
    use_loss_kernel(net, key.loss)
    if key.adapters is not None:  # PEFT's own adapters, as the simulator adds them (advisor.simulate.step)
        net = _with_adapters(net, key.adapters)
    net.train()
    if key.checkpointing != "off":
        with _quiet():
            apply_activation_checkpointing(net, blocks=find_blocks(net), selective=key.checkpointing == "selective")
    return net


def _with_adapters(net: Any, adapters: AdapterKey) -> Any:
    """PEFT's LoRA / DoRA on the meta model (the base frozen), the inner model returned as a training
    script's forward runs it."""
    import peft

    targets = adapters.targets
    with _quiet():  # GPT-2's Conv1D: PEFT warns that it sets fan_in_fan_out itself
        wrapped = peft.get_peft_model(net, peft.LoraConfig(
            r=adapters.rank, target_modules=targets[0] if targets == ("all-linear",) else list(targets) if targets
            else None, use_dora=adapters.dora, lora_dropout=adapters.dropout))
    return wrapped.base_model.model


@contextlib.contextmanager
def quiet_transformers():
    """transformers' own log warnings while the tracer builds and steps a model of the user's config (GPT-2's
    "`loss_type=None` was set in the config but it is unrecognized"): about that model, not the plan, and a line
    between the plan's progress and its answer. Errors still show."""
    from transformers.utils import logging  # configures the library's logger first, so its level is not reset later

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


@contextlib.contextmanager
def _quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def measure_traced_step(cfg: dict, key: ProfileKey, *, num_layers: int, micro_batch_size: int,
                        built: dict | None = None) -> dict[str, int]:
    """One traced step at (num_layers, micro_batch_size): the phase peaks, and one block's saved bytes.
    ``built``: meta models already built, by (blocks, checkpointing), reused (``materialize`` gives
    them fresh fake storage in each step's mode)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from advisor.simulate.autocast import cuda_fp32_policy
    from advisor.simulate.model import materialize
    from advisor.simulate.cuda_kernels import cuda_grouped_mm, cuda_sdpa, cuda_softmax_backward
    from advisor.simulate.fake_env import cuda_dropout, kernel_scratch, unpacked_batches

    built = {} if built is None else built
    if (num_layers, key.checkpointing, key.adapters) not in built:
        built[num_layers, key.checkpointing, key.adapters] = _build(cfg, key, num_layers)
    net = built[num_layers, key.checkpointing, key.adapters]
    # A bf16 residual under autocast is a LoRA base held in bf16 with fp32 adapters (the recipe's frozen_base);
    # otherwise every weight in the residual's dtype.
    bf16_base = key.residual_bytes == 2 and key.input_casts
    with FakeTensorMode(), unpacked_batches(), cuda_dropout(), cuda_sdpa(), cuda_grouped_mm(), kernel_scratch(), \
            _quiet():
        materialize(net, device="cpu", real=False,
                    dtype=torch.bfloat16 if key.residual_bytes == 2 and not bf16_base else torch.float32,
                    frozen_dtype=torch.bfloat16 if bf16_base else None)
        params = [p for p in net.parameters()] + [b for b in net.buffers()]
        log = _LiveLog({p.untyped_storage()._cdata for p in params})
        saved, grads, handles, hooks = _watch(net, params, log, count_saved=key.checkpointing == "off")
        ids = torch.randint(0, int(cfg.get("vocab_size") or 1000), (micro_batch_size, key.seq_len))
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if key.input_casts else contextlib.nullcontext()
        policy = cuda_fp32_policy() if key.input_casts else contextlib.nullcontext()
        with log.mode, policy, cuda_softmax_backward():  # inside the log: it must see CUDA's product
            with cast, hooks:
                loss = net(input_ids=ids, labels=ids).loss
            log.mark("forward_end")
            loss.backward()
            del loss
        for h in handles:
            h.remove()
        if "blocks_backward" not in log.marks:
            raise ValueError("the gradient never reached the last block's output (its output is not a tensor)")
        out = log.replay(left_out=log.casts | grads)
        out["at_blocks"] -= log.incoming
        out["layer_saved"] = sum(saved.values())
        return out


def _watch(net: Any, params: list, log: _LiveLog, *, count_saved: bool) -> tuple[dict, set, list, Any]:
    """Hooks for one traced step: the first block's saved tensors (``saved_tensors_hooks``, by storage,
    parameters and autocast's weight copies left out; not under checkpointing, whose own hooks take
    precedence), every tensor that becomes a ``.grad`` (even one later replaced), and the moment the
    gradient reaches the last block. Returns (saved, grads, handles to remove, the saved-tensor hooks)."""
    from torch.autograd.graph import saved_tensors_hooks

    from wrappers.blocks import find_blocks

    blocks = find_blocks(net)
    if not blocks:
        raise ValueError("the traced path found no repeated blocks in this model")
    saved: dict[int, int] = {}
    inside = {"first": False}

    def pack(t):
        st = t.untyped_storage()
        if inside["first"] and st._cdata not in log.params and log.uid_of(t) not in log.casts:
            saved[st._cdata] = st.nbytes()
        return t

    grads: set[int | None] = set()
    for p in params:
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda q: grads.add(log.uid_of(q.grad)))
    first, last = blocks[0], blocks[-1]
    handles = [first.register_forward_pre_hook(lambda *a: inside.__setitem__("first", True)),
               first.register_forward_hook(lambda *a: inside.__setitem__("first", False)),
               first.register_forward_pre_hook(lambda m, a, kw: _on_block_start(a, kw, log, top=False),
                                               with_kwargs=True),
               last.register_forward_pre_hook(lambda m, a, kw: _on_block_start(a, kw, log, top=True),
                                              with_kwargs=True),
               last.register_forward_hook(lambda m, a, out: _on_grad(out, log))]
    hooks = saved_tensors_hooks(pack, lambda t: t) if count_saved else contextlib.nullcontext()
    return saved, grads, handles, hooks


def _on_block_start(args: tuple, kwargs: dict, log: _LiveLog, *, top: bool) -> None:
    """At the first forward of the top block (``top``) or of the bottom one: mark the moment and its
    hidden-state input, and hook the moment the gradient reaches that input (the block's backward is done)."""
    start = "top_start" if top else "bottom_block_start"
    if start in log.marks:
        return  # a checkpointed block's forward, run again in backward
    log.mark_once(start)
    hidden = args[0] if args else kwargs.get("hidden_states")
    if top:
        log.top_input = log.uid_of(hidden) if hidden is not None else None
    if hidden is not None and hidden.requires_grad:
        done = "top_backward_end" if top else "bottom_start"
        hidden.register_hook(lambda grad: log.mark_once(done))


def _on_grad(out: Any, log: _LiveLog) -> None:
    """Mark the moment the top block's forward ends (and its output), and hook the moment the gradient
    reaches that output (its backward begins)."""
    hidden = out[0] if isinstance(out, tuple) else out
    if "top_end" not in log.marks:
        log.mark_once("top_end")
        log.top_output = log.uid_of(hidden)

    def hook(grad):
        log.mark("blocks_backward")
        log.incoming = grad.untyped_storage().nbytes()

    hidden.register_hook(hook)


def one_block_less(point: dict[str, int]) -> dict[str, int]:
    """The moments of the same step with one block less, from a traced step (``measure_traced_step``'s output).

    The blocks are one module repeated, each fed the output of the one below. Removing the top block
    removes what its forward left live (``top_block``: the storages it made, bar its output, which takes
    the part the output below it plays with one block less, plus that input if the top block keeps it) from
    every moment after it: the forward peak (logits and loss), the loss backward, the start of the blocks'
    backward. The blocks' backward peaks either while the top block runs it (less the same) or where every
    block is done (the same step either way). Equal, to the byte, to a traced
    one-block step on every held-out family, batch 1 and 2, with and without checkpointing
    (tests/simulate/test_profile_derive.py; benchmarks/results/trace_speed.md)."""
    out = dict(point)
    for name in ("forward", "loss", "at_blocks"):
        out[name] = point[name] - point["top_block"]
    out["blocks"] = max(point["blocks_top"] - point["top_block"], point["blocks_bottom"])
    return out


def trace_profile(cfg: dict, key: ProfileKey, *, layer_saved: int | None = None,
                  built: dict | None = None) -> BlockProfile:
    """The profile of ``cfg`` under ``key``, from steps of two blocks at batch 1 and 2 (the one-block points
    are derived from them, ``one_block_less``: two traced steps instead of four).
    ``layer_saved``: one block's saved bytes per sample without checkpointing, when already traced
    (the profile without checkpointing has it); otherwise a checkpointed key traces one more step."""
    built = {} if built is None else built
    two = [measure_traced_step(cfg, key, num_layers=2, micro_batch_size=b, built=built) for b in (1, 2)]
    points = [one_block_less(two[0]), two[0], one_block_less(two[1]), two[1]]
    if key.checkpointing == "off":
        layer_saved = two[0]["layer_saved"]
    elif layer_saved is None:
        off = validated_copy(key, {"checkpointing": "off"})
        layer_saved = measure_traced_step(cfg, off, num_layers=2, micro_batch_size=1, built=built)["layer_saved"]

    def solve(name: str) -> Bilinear:
        return Bilinear.solve(*(r[name] for r in points))

    saved = solve("at_blocks")
    # A checkpointed block recreates in backward what it would have saved, less what it kept.
    recompute = Bilinear(const=0, per_sample=0, per_layer=0, per_layer_sample=0)
    if key.checkpointing != "off":
        recompute = Bilinear(const=0, per_sample=max(0, layer_saved - saved.per_layer_sample), per_layer=0,
                             per_layer_sample=0)
    return BlockProfile(key=key, saved=saved, forward_peak=solve("forward"), loss_peak=solve("loss"),
                        block_peak=solve("blocks"), recompute=recompute, layer_saved_per_sample=layer_saved)
