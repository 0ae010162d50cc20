"""One pipeline stage under a schedule, on fake tensors: the stage's peak with its in-flight micro-batches.

``simulate_stage(model, schedule=, stage=, num_stages=, num_microbatches=, micro_batch_size=,
training=)`` builds the stage's chunks (``advisor.simulate.pipeline_chunks``: its decoder layers,
the embeddings on the pipeline's first chunk, the final norm, head and loss on its last) on fake
tensors (``FakeTensorMode``: shapes and dtypes, no storage), and replays the stage's passes in the
schedule's order (``advisor.simulate.pipeline_order``) for two steps: forward of each micro-batch
(keeping its autograd graph until its backward), the whole backward (BW), or the zero-bubble split
into B (input gradient; the linear layers' inputs and output gradients kept) and W (weight
gradients), then ``optimizer.step()`` and ``zero_grad``. The second step is measured op by op: every
tensor storage an operation creates is counted until Python frees it (``LiveBytes`` in
``advisor.simulate.measure``, a dispatch mode; see there why not ``MemTracker``).

What a stage receives and sends is made, not communicated: a non-first chunk's input is a fresh
tensor of the hidden states' shape (the receive buffer), the gradient its backward starts from is
another (the received gradient). After sending, a chunk's output is freed as Megatron-LM frees it
(``deallocate_output_tensor``: only its autograd node is kept) unless ``free_outputs=False``, which
keeps it as torch.distributed.pipelining's stage does (its ``fwd_cache`` holds the output).

The same CPU stand-ins as ``advisor.simulate.step``: fake ``cpu`` tensors, CUDA's autocast fp32
list, CUDA's fused dropout (bool mask), attention dropout 0. Under a mixed precision the whole step
runs in one autocast region (the weights' compute-dtype copies live for the step, as autocast's
cache keeps them) and every backward runs with autocast off.

Imports torch; the planning path never imports this module.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from advisor.simulate.pipeline_order import StagePass, max_in_flight, resolve_schedule, stage_order
from advisor.training import TrainingConfig


class StagePeak(BaseModel):
    """One stage's peak during the measured step, split like ``SimulatedStep``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    schedule: str
    stage: int
    num_stages: int
    virtual_stages: int
    num_microbatches: int
    micro_batch_size: int
    seq_len: int
    precision: str
    chunk_layers: tuple[int, ...] = Field(description="Decoder layers of each chunk on this stage.")
    max_in_flight: int = Field(description="Most chunk forwards held at once (their backward not yet run).")
    params: int
    grads: int
    optimizer: int
    activations: int = Field(description="Saved activations of the micro-batches in flight, inputs, W stashes.")
    temporary: int
    peak_pass: str = Field(description="The pass during which the peak was reached, e.g. 'F3' or 'B0.1'.")
    live_after: tuple[tuple[str, int], ...] = Field(description="Live bytes at the end of each pass of the measured "
                                                               "step, in order (the optimizer step last).")
    wall_s: float

    @property
    def peak_bytes(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.temporary


def split_layers(num_layers: int, num_chunks: int) -> tuple[int, ...]:
    """``num_layers`` over ``num_chunks`` virtual stages, evenly; ``ValueError`` when it does not divide."""
    if num_layers % num_chunks:
        raise ValueError(f"{num_layers} layers do not split evenly over {num_chunks} chunks: "
                         "give layers_per_chunk")
    return (num_layers // num_chunks,) * num_chunks


def simulate_stage(
    model: str | dict,
    *,
    schedule: str,
    stage: int,
    num_stages: int,
    num_microbatches: int,
    micro_batch_size: int,
    training: TrainingConfig,
    virtual_stages: int = 1,
    layers_per_chunk: tuple[int, ...] | None = None,
    free_outputs: bool = True,
) -> StagePeak:
    """Measure stage ``stage`` (0 = first) of a ``num_stages`` pipeline for one steady-state step.

    ``layers_per_chunk``: decoder layers of each of the ``num_stages x virtual_stages`` chunks in
    pipeline order (chunk c of stage i is entry c * num_stages + i, as Megatron places them);
    default: the model's layers split evenly.
    """
    from advisor.simulate.model import resolve_config

    name_, cfg = resolve_config(model)
    order = stage_order(schedule, stage=stage, num_stages=num_stages, num_microbatches=num_microbatches,
                        virtual_stages=virtual_stages)
    total = num_stages * virtual_stages
    if layers_per_chunk is None:
        from advisor.model.config_keys import config_value
        layers_per_chunk = split_layers(int(config_value(cfg, "num_layers")), total)
    if len(layers_per_chunk) != total:
        raise ValueError(f"layers_per_chunk has {len(layers_per_chunk)} entries, not {num_stages} x {virtual_stages}")
    chunk_ids = [c * num_stages + stage for c in range(virtual_stages)]
    start = time.perf_counter()
    peak, breakdown, marks = _run(cfg, order, chunk_ids, layers_per_chunk, training=training,
                                  micro_batch_size=micro_batch_size, free_outputs=free_outputs)
    assert peak == sum(breakdown.values())
    return StagePeak(model=name_, schedule=resolve_schedule(schedule), stage=stage, num_stages=num_stages,
                     virtual_stages=virtual_stages, num_microbatches=num_microbatches,
                     micro_batch_size=micro_batch_size, seq_len=training.seq_len, precision=training.precision,
                     chunk_layers=tuple(layers_per_chunk[c] for c in chunk_ids), max_in_flight=max_in_flight(order),
                     **breakdown, peak_pass=_peak_pass(marks),
                     live_after=tuple((label, live) for label, _, live in marks), wall_s=round(time.perf_counter() - start, 3))


def _run(cfg: dict, order: tuple[StagePass, ...], chunk_ids: list[int], layers_per_chunk: tuple[int, ...], *,
         training: TrainingConfig, micro_batch_size: int,
         free_outputs: bool) -> tuple[int, dict[str, int], list[tuple[str, int, int]]]:
    import torch

    from advisor.simulate.fake_env import cuda_autocast_policy, cuda_dropout, cuda_kernels, fake_mode, unpacked_batches
    from advisor.simulate.cuda_kernels import cuda_softmax_backward
    from advisor.simulate.measure import LiveBytes
    from advisor.simulate.model import build_optimizer, materialize, net_vocab, training_dtypes
    from advisor.simulate.pipeline_chunks import WeightGradStore, build_chunk, defer_linears

    last_id = len(layers_per_chunk) - 1
    chunks = [build_chunk(cfg, num_layers=layers_per_chunk[c], first=c == 0, last=c == last_id,
                          attention=training.attention) for c in chunk_ids]
    store = WeightGradStore()
    info = training.precision_info
    with fake_mode(), cuda_autocast_policy(training), unpacked_batches(), cuda_dropout(), cuda_kernels():
        for chunk in chunks:
            materialize(chunk, device="cpu", real=False, dtype=training_dtypes(training)[0])
            defer_linears(chunk, store)
            chunk.train()
        params = list(dict.fromkeys(p for chunk in chunks for p in chunk.parameters()))
        opt = build_optimizer(params, training)
        if info.mixed:
            store.compute_dtype = getattr(torch, info.compute_dtype)
        hidden = chunks[0].net.get_input_embeddings().embedding_dim
        act_dtype = params[0].dtype if not info.mixed else torch.float32
        ids = torch.randint(0, int(net_vocab(cfg)), (micro_batch_size, training.seq_len))
        shape = (micro_batch_size, training.seq_len, hidden)
        runner = _Runner(chunks, store, ids, shape, act_dtype, free_outputs, training)
        # Warm-up: one micro-batch through each chunk and an optimizer step, so that the optimizer
        # state exists in the measured step, as in a steady state.
        runner.step(tuple(StagePass(k, 0, c) for c in range(len(chunks)) for k in ("F", "BW")), opt, mark=None)
        live = LiveBytes(params, opt)
        live.track_existing([ids])
        marks: list[tuple[str, int, int]] = []
        with live, cuda_softmax_backward():
            runner.step(order, opt, mark=lambda label: marks.append((label, live.peak, live.total)))
        breakdown = live.breakdown()
    return sum(breakdown.values()), breakdown, marks


def _peak_pass(marks: list[tuple[str, int, int]]) -> str:
    """The first pass after which the peak reached its final value."""
    final = marks[-1][1] if marks else 0
    return next((label for label, peak, _ in marks if peak == final), "")


class _Runner:
    """Runs the passes of one step; holds each in-flight micro-batch's graph between its F and its B."""

    def __init__(self, chunks: list, store: Any, ids: Any, shape: tuple[int, ...], act_dtype: Any,
                 free_outputs: bool, training: TrainingConfig) -> None:
        self.chunks, self.store, self.ids, self.shape = chunks, store, ids, shape
        self.act_dtype, self.free_outputs, self.training = act_dtype, free_outputs, training
        self.live: dict[tuple[int, int], tuple[Any, Any]] = {}

    def step(self, order: tuple[StagePass, ...], opt: Any, *, mark: Any) -> None:
        from wrappers.recipe import autocast_context

        with autocast_context(self.training.precision, "cpu"):
            for p in order:
                {"F": self._forward, "B": self._backward, "BW": self._backward, "W": self._weight}[p.kind](p)
                if mark is not None:
                    mark(f"{p.kind}{p.microbatch}" + (f".{p.chunk}" if len(self.chunks) > 1 else ""))
        self.store.end_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mark is not None:
            mark("optimizer step")

    def _forward(self, p: StagePass) -> None:
        import torch

        chunk = self.chunks[p.chunk]
        # The received hidden states (Megatron's input_tensor, held until this micro-batch's backward). No
        # gradient is asked of it: the one sent back is the residual stream's gradient at the chunk's
        # input, which the backward computes anyway (GPT-2's position add, the first norm's weights).
        inputs = self.ids if chunk.first else torch.empty(self.shape, dtype=self.act_dtype)
        out = chunk(inputs, self.ids)
        if not chunk.last and self.free_outputs:
            # Megatron-LM's deallocate_output_tensor: the sent output's storage goes, its grad_fn stays.
            out.data = torch.empty((1,), dtype=out.dtype)
        self.live[(p.microbatch, p.chunk)] = (out, inputs)

    def _backward(self, p: StagePass) -> None:
        import torch

        out, inputs = self.live.pop((p.microbatch, p.chunk))
        self.store.defer, self.store.key = p.kind == "B", (p.microbatch, p.chunk)
        grad = torch.ones_like(out) if self.chunks[p.chunk].last else torch.empty(self.shape, dtype=out.dtype)
        with _autocast_off():
            # Megatron-LM's custom_backward: the engine directly, since a freed output's shape no
            # longer matches its gradient's.
            torch.autograd.Variable._execution_engine.run_backward(
                (out,), (grad,), False, False, (), True, True)
        del out, grad, inputs
        self.store.defer = False

    def _weight(self, p: StagePass) -> None:
        with _autocast_off():
            self.store.run_w((p.microbatch, p.chunk))


@contextlib.contextmanager
def _autocast_off():
    import torch

    with torch.autocast("cpu", enabled=False):
        yield
