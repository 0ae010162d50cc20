"""What a publisher's training code held beyond the recipe the planner models, added per case of
``profiles/published_memory.json`` (its ``publisher_code`` list) to the estimate at each moment of the
step (``benchmarks/published_memory.py``). Never in the planner: each is a setting of that code or of the
library version it pinned; today's transformers + PEFT + bitsandbytes >= 0.43.2 recipe does none of them
(FSDP1's ``no_sync`` gradients remain in today's Lightning Fabric ``FSDPStrategy``, which litgpt's full
fine-tune still runs; not in our ``lightning`` recipe). Sources (repository, path, commit, line) in the
JSON's ``publisher_code`` key.

- ``litgpt_untied_head``: litgpt's checkpoint conversion copies a tied embedding into its own
  ``lm_head.weight``, so a tied model holds a second V x C matrix (bf16, or 4-bit with the next one).
- ``lightning_bnb_every_linear``: Lightning's ``BitsandbytesPrecision`` swaps ``torch.nn.Linear`` for
  its bitsandbytes class while litgpt builds the model, so the output head is 4-bit too: packed at
  rest, and dequantised whole for each of litgpt's 128-token head chunks in forward and backward.
- ``lightning_fp16_quant_state``: Lightning's ``_Linear4bit.quantize`` casts the weight to
  fp16 before ``quantize_4bit``, so ``dequantize_4bit`` returns fp16 and ``MatMul4Bit``'s
  ``.to(A.dtype)`` makes a second, bf16 copy: 4 bytes per weight of the linear being dequantised.
- ``bnb_ctx_keeps_input``: bitsandbytes < 0.43.2 ``MatMul4Bit.forward`` stores its input in
  ``ctx.tensors``, a Python attribute that backward never releases: it lives as long as the autograd
  graph, which litgpt's loop keeps through ``logits`` until the next iteration's forward returns.
  Without checkpointing each block keeps the distinct inputs of its 4-bit linears (norm_1 output,
  the attention output that ``y.reshape`` copies, norm_2 output, the MLP's product) and the model the
  final norm's output (the head chunks are views of it); LoRA dropout gives the adapters their own
  copies, so nothing else saves these; the first block's first input is not kept (``MatMul4Bit`` keeps
  ``A`` only when ``any(ctx.needs_input_grad[:2])``, and the frozen embedding's output normalised by a
  frozen norm needs no gradient). This iteration's are held from the forward through the step, the
  previous iteration's until the forward returns (assumed padded to the same length). bitsandbytes
  0.41.1 (litgpt's 2023 resource tables) has the same lines.
- ``litgpt_longest_first``: lit-gpt's 2023 ``finetune/lora.py`` forces the longest training sample into
  iteration 0's batch and pads the batch to it, so at that length no earlier iteration's graph (and
  none of its kept inputs) is held; later iterations keep the previous graph beside a random, shorter
  batch (the 2024 loop draws every batch at random: there the previous iteration is taken at the same
  length).
- ``hf_fp32_logits_held``: transformers < 4.46 ``LlamaForCausalLM.forward`` returns ``logits.float()``
  (the bf16 logits die at once) and computes the loss on a shifted ``.contiguous()`` fp32 copy, and
  Answer.AI's train.py keeps ``output`` until after ``optimizer.step()``: 4 bytes a logit live from the
  loss through backward and the step, and the forward's loss peaks at 4 + 4 + 4 bytes a logit where
  today's recipe holds 2 + 4 + 4 (``benchmarks/qlora_published.py`` adds the same to the Answer.AI
  QLoRA cases).
- ``hf_shift_logits_copy``: transformers 4.46 to 4.48 ``ForCausalLMLoss`` (the loss the model's forward calls on
  its bf16 logits) binds ``logits = logits.float()`` and then computes the cross-entropy on
  ``shift_logits = logits[..., :-1, :].contiguous()``, a second fp32 copy, so the loss's forward peaks at
  2 + 4 + 4 + 4 bytes a logit (the bf16 logits, the upcast, its shifted copy, the log-softmax) where today's
  release, which pads the labels instead of slicing the logits, holds 2 + 4 + 4; both copies die when the loss
  returns, so the backward and the step hold what the estimate counts.
- ``lightning_fsdp1_no_sync``: Lightning 2.1 Fabric's ``FSDPStrategy`` is FSDP1 with
  ``use_orig_params=True``, and litgpt's LoRA loop wraps every micro-step but the last of its
  accumulation (128 / micro-batch of them) in ``fabric.no_backward_sync``, which is FSDP1's
  ``no_sync()``. Each Block is one ``FlatParameter`` holding its frozen base and its adapters, so the
  flat parameter requires a gradient and autograd returns the gradient of the whole unit: every view's
  gradient (the frozen weights' too), concatenated by ``torch.split``'s backward into a new tensor of
  the unit's size, in the parameter dtype (bf16-true: bf16). Under ``no_sync`` that unsharded gradient
  is kept in ``.grad`` and accumulated in place until the synchronising micro-step reduce-scatters it,
  so from the second micro-step on every block's whole unsharded gradient is held (Llama-2-7B: 32 x
  202,514,432 x 2 bytes = 12.96 GB a rank), and a block's backward ends with its views' gradients and
  their concatenation beside them (2 x 405 MB) once its recomputed activations are gone; in its MLP the
  frozen down projection's weight gradient is already there. After the synchronising micro-step the
  optimizer sees each unit's sharded flat gradient, the frozen part included.
- ``hf_checkpoint_around_fsdp1_unit``: transformers < 4.52 checkpoints a block from the model's own loop
  (``self._gradient_checkpointing_func(decoder_layer.__call__, ...)``), and under FSDP1 that loop's layers are the
  FSDP wrappers, so FSDP1's forward runs inside the checkpoint (4.52's ``GradientCheckpointingLayer`` checkpoints
  inside the wrapper instead). Under reentrant checkpointing (4.48's default) the first forward runs without grad
  and the recompute in backward with it; there, for a unit whose flat parameter needs no gradient (PEFT's wrap
  policy leaves a layer's unit only the frozen base), FSDP1's pre-forward registers its reshard-only hook with
  ``register_multi_grad_hook`` on the unit's input, the checkpoint's detached leaf copy of the block input. The
  hook's closure holds the leaf's ``AccumulateGrad`` node, hence the leaf, and the handle lives on the flat
  parameter until ``_finalize_params`` at the end of backward; the reentrant backward accumulates the block
  input's gradient into that leaf's ``.grad``. So each block's input and its gradient stay from the block's
  backward to the end of backward. At the bottom block's backward (the last to run) the L - 1 blocks above it keep
  their inputs' gradients; the estimate's block moment (the top block's) holds every block's input and the one
  gradient flowing into the block, which here is one of those L - 1: L - 2 tensors of batch x sequence x hidden more.
  At the end of backward 2 L - 1 more than today's release holds (every input and gradient; which one is not kept
  is not identified). On an H100 (torch 2.11) with transformers 4.48.1, PEFT 0.13.2 and accelerate 1.0.1 each block's
  backward left 0.125 GiB more (Mistral-7B at 4 x 4096 tokens, bf16) where 5.17 frees as much: 30.2 such tensors
  from the top block's recompute to the bottom one's (L - 2 = 30), 62.9 more than 5.17 at the end of backward.
"""

from __future__ import annotations

from advisor.estimate.quantized import quantized_base, quantized_linear_bytes
from advisor.model.spec import ModelSpec
from advisor.training import TrainingConfig
from advisor.units import GIB

MOMENTS = ("end_of_forward", "loss_backward", "block_backward", "optimizer_step")
FSDP1_NO_SYNC = "lightning_fsdp1_no_sync"
LONGEST_FIRST = "litgpt_longest_first"
FP32_LOGITS_HELD = "hf_fp32_logits_held"
SHIFT_COPY = "hf_shift_logits_copy"
CKPT_AROUND_FSDP1 = "hf_checkpoint_around_fsdp1_unit"
KNOWN = {"litgpt_untied_head", "lightning_bnb_every_linear", "lightning_fp16_quant_state", "bnb_ctx_keeps_input",
         FSDP1_NO_SYNC, LONGEST_FIRST, FP32_LOGITS_HELD, SHIFT_COPY, CKPT_AROUND_FSDP1}


def kept_inputs_bytes(spec: ModelSpec, training: TrainingConfig, tokens: int) -> int:
    """One iteration's ``MatMul4Bit`` inputs that ``bnb_ctx_keeps_input`` holds (module docstring), in
    the compute dtype: per block 2 x hidden + heads x head_dim + intermediate, plus the final norm's,
    less the first block's norm_1 output (it needs no gradient, so ``ctx.tensors`` is ``(None, None)``)."""
    hidden, inter = spec.hidden_size or 0, spec.intermediate_size or 0
    attention = (spec.num_attention_heads or 0) * (spec.head_dim or hidden // max(spec.num_attention_heads or 1, 1))
    # + ln_f's output (hidden), - the first block's norm_1 output (hidden)
    per_token = (spec.num_layers or 0) * (2 * hidden + attention + inter)
    return training.compute_bytes * tokens * per_token


def extra_bytes(case: dict, spec: ModelSpec, training: TrainingConfig, *, previous_iteration: bool = True) -> dict[str, int]:
    """Bytes the case's code held at each moment beyond the estimate (may be negative: a 4-bit head
    where the estimate counts a bf16 one). ``previous_iteration=False`` (or ``litgpt_longest_first`` in
    the case's list): the previous batch's kept inputs left out (no batch, or a shorter one, before the
    longest). ValueError for a name this module does not know or a combination it does not model."""
    rest, head_dq, block_dq, kept = parts(case, spec, training)
    if LONGEST_FIRST in case.get("publisher_code", []):
        previous_iteration = False
    extra = {
        # this iteration's kept inputs and the previous one's (freed when `logits` is rebound); last head chunk
        "end_of_forward": rest + (2 if previous_iteration else 1) * kept + head_dq,
        "loss_backward": rest + kept + head_dq,  # the head chunks' backward dequantise again
        "block_backward": rest + kept + block_dq,
        "optimizer_step": rest + kept,  # the graph lives on through the step (``logits``)
    }
    if FP32_LOGITS_HELD in case.get("publisher_code", []):
        for name, value in fp32_logits_held_bytes(case, spec).items():
            extra[name] += value
    if SHIFT_COPY in case.get("publisher_code", []):
        extra["end_of_forward"] += shift_copy_bytes(case, spec)
    if FSDP1_NO_SYNC in case.get("publisher_code", []):
        for name, value in fsdp1_no_sync_bytes(case, spec, training).items():
            extra[name] = extra.get(name, 0) + value
    if CKPT_AROUND_FSDP1 in case.get("publisher_code", []):
        for name, value in checkpoint_around_fsdp1_bytes(case, spec, training).items():
            extra[name] = extra.get(name, 0) + value
    return extra


def checkpoint_around_fsdp1_bytes(case: dict, spec: ModelSpec, training: TrainingConfig) -> dict[str, int]:
    """``hf_checkpoint_around_fsdp1_unit`` (module docstring) beyond the estimate: at the bottom block's backward L - 2
    block-input gradients (the estimate's block moment holds every block's input and the gradient flowing into the
    block), at the end of backward 2 L - 1 block inputs and gradients (62.9 measured); each batch x sequence x hidden
    in the compute dtype (the block input's dtype without autocast). ValueError where the case is not an FSDP1 LoRA
    whose layer units hold only the frozen base (the recipe's adapter units), every block checkpointed, in one dtype."""
    if (case.get("fsdp_version") != 1 or case["activation_checkpointing"] != "on" or training.lora is None
            or training.mixed or not training.recipe.adapter_units):
        raise ValueError(f"{case['id']}: {CKPT_AROUND_FSDP1} is modelled for an FSDP1 LoRA with adapter units, every "
                         "block checkpointed, pure bf16/fp32")
    layers = spec.num_layers or 0
    one = training.compute_bytes * case["micro_batch_size"] * case["seq_len"] * (spec.hidden_size or 0)
    return {"block_backward": (layers - 2) * one, "end_of_backward": (2 * layers - 1) * one}


def shift_copy_bytes(case: dict, spec: ModelSpec) -> int:
    """``hf_shift_logits_copy`` (module docstring): the shifted fp32 copy at the loss's forward, 4 bytes a logit of
    every position but each sample's last. ValueError unless the case plans the hf loss."""
    if case["loss"] != "hf":
        raise ValueError(f"{case['id']}: {SHIFT_COPY} is modelled beside the hf loss")
    return 4 * case["micro_batch_size"] * (case["seq_len"] - 1) * (spec.vocab_size or 0)


def fp32_logits_held_bytes(case: dict, spec: ModelSpec) -> dict[str, int]:
    """``hf_fp32_logits_held`` (module docstring) beyond the hf loss the estimate counts: per logit +2 bytes at
    the end of the forward (fp32 logits, their shifted copy and the log-softmax, 12, against bf16 logits, their
    fp32 copy and the log-softmax, 10), +4 from the loss's backward through the step (the returned fp32 logits).
    ValueError unless the case plans the hf loss."""
    if case["loss"] != "hf":
        raise ValueError(f"{case['id']}: {FP32_LOGITS_HELD} is modelled beside the hf loss")
    logits = case["micro_batch_size"] * case["seq_len"] * (spec.vocab_size or 0)
    return {"end_of_forward": 2 * logits, "loss_backward": 4 * logits, "block_backward": 4 * logits,
            "optimizer_step": 4 * logits}


def fsdp1_no_sync_bytes(case: dict, spec: ModelSpec, training: TrainingConfig) -> dict[str, int]:
    """``lightning_fsdp1_no_sync`` (module docstring) at each moment of an accumulating micro-step, beyond
    the FSDP2 zero3 estimate of the same job (which already counts the sharded parameters, the unsharded
    root, the block in backward and the one being gathered, as FSDP1 with ``limit_all_gathers`` and
    backward prefetch holds them), and at the step that follows the synchronising one. ValueError where
    the case is not a LoRA of the blocks under zero3 with every block checkpointed, in one dtype."""
    from advisor.estimate.memory import _activations  # the recomputed block the split moment frees
    from advisor.estimate.strategy_buffers import block_params
    from advisor.strategies import get_strategy

    if (case["strategy"] != "zero3" or case["activation_checkpointing"] != "on" or training.lora is None
            or training.quantize is not None or training.mixed):
        raise ValueError(f"{case['id']}: {FSDP1_NO_SYNC} is modelled for a bf16-true/fp32-true LoRA under zero3 "
                         "with every block checkpointed")
    layer, n_layers, _ = block_params(spec)
    if spec.trainable_params > layer * n_layers:
        raise ValueError(f"{case['id']}: {FSDP1_NO_SYNC} is modelled with every trainable parameter in the blocks")
    world = 1
    for count in case["gpus"].split("x")[:-1]:
        world *= int(count)
    pb = training.param_bytes
    unit = pb * layer  # one Block's unsharded flat gradient, frozen base included
    held = n_layers * unit  # every Block's, accumulated over the previous micro-steps
    # The estimate's gradients of one block's adapters and their reduce-scatter input (strategy_buffers: (ub +
    # reduce_b) x a block's trainable parameters, both the param dtype here); under no_sync there is neither.
    counted = 2 * pb * -(-spec.trainable_params // n_layers)
    acts = _activations(spec, training, get_strategy("zero3").on("torch"),
                        micro_batch_size=case["micro_batch_size"], checkpointing=True)
    # The block's backward: in its MLP the frozen down projection's weight gradient (the first computed), or
    # at its end every view's gradient and their concatenation, its recomputed activations freed.
    in_mlp = pb * (spec.intermediate_size or 0) * (spec.hidden_size or 0)
    at_split = 2 * unit - acts.recompute_bytes - acts.backward_temp_bytes - counted
    shards = -(-pb * spec.trainable_params // world)  # what the estimate holds as gradient shards
    return {
        "start_of_forward": held, "end_of_forward": held, "loss_backward": held,
        "block_backward": held + max(in_mlp, at_split),
        "end_of_backward": held - shards,
        # after the synchronising micro-step: each unit's sharded flat gradient, the frozen part included
        "optimizer_step": n_layers * unit // world - shards,
    }


def parts(case: dict, spec: ModelSpec, training: TrainingConfig) -> tuple[int, int, int, int]:
    """(head at rest beyond what the estimate counts, the head's dequantised copies, the block linear's
    copy beyond the estimate's one, one iteration's kept inputs), bytes."""
    names = set(case.get("publisher_code", []))
    if not names:
        return 0, 0, 0, 0
    if names - KNOWN:
        raise ValueError(f"{case['id']}: unknown publisher_code {sorted(names - KNOWN)}")
    quantized = training.quantize is not None
    if names & {"lightning_fp16_quant_state", "bnb_ctx_keeps_input"} and not {"lightning_bnb_every_linear"} <= names:
        raise ValueError(f"{case['id']}: the 4-bit head's mechanisms are modelled for Lightning's plugin only")
    if LONGEST_FIRST in names and "bnb_ctx_keeps_input" not in names:
        raise ValueError(f"{case['id']}: {LONGEST_FIRST} changes only what bnb_ctx_keeps_input holds")
    if "bnb_ctx_keeps_input" in names and (case["activation_checkpointing"] != "off"
                                            or not (training.lora and training.lora.dropout)):
        raise ValueError(f"{case['id']}: bnb_ctx_keeps_input is modelled without checkpointing, LoRA dropout on")
    vocab, hidden, cb = spec.vocab_size or 0, spec.hidden_size or 0, training.compute_bytes
    head = vocab * hidden
    untied = "litgpt_untied_head" in names and spec.tied_embeddings
    if not untied and spec.tied_embeddings and "lightning_bnb_every_linear" in names:
        raise ValueError(f"{case['id']}: a tied head quantised by Lightning needs litgpt_untied_head")
    rest = cb * head if untied else 0  # the head the estimate counts: none when tied, else compute dtype
    counted = 0 if spec.tied_embeddings else cb * head
    dequantized = cb  # bytes per weight while a 4-bit linear is dequantised
    head_dq = 0
    if quantized and "lightning_bnb_every_linear" in names:
        packed, constants = quantized_linear_bytes(hidden, vocab, training.quantize, double_quant=training.double_quant)
        rest = packed + constants - counted
        if "lightning_fp16_quant_state" in names:
            dequantized = 2 + cb  # fp16 dequantize_4bit output, then its bf16 .to(A.dtype) copy
        head_dq = dequantized * head
    block_dq = 0
    if quantized and dequantized > cb:  # the estimate counts one bf16 copy of the largest block linear
        q = quantized_base(spec, training.quantize, double_quant=training.double_quant)
        block_dq = (dequantized - cb) * q.largest_linear_params
    kept = 0
    if quantized and "bnb_ctx_keeps_input" in names:
        kept = kept_inputs_bytes(spec, training, case["micro_batch_size"] * case["seq_len"])
    return rest, head_dq, block_dq, kept


def breakdown(case: dict) -> dict:
    """GiB for one case: the published peak, the estimate before and after, each mechanism's bytes and
    what they add at the moment that wins with them (the table ``main`` prints)."""
    import published_memory as pm  # the benchmark imports this module: import it late

    plan = pm.plan_of(case)
    moments = plan.candidate(case["strategy"]).memory_bytes.moments
    spec, training = plan.model, plan.training

    def peak(extra: dict[str, int]) -> float:
        return max(value + extra.get(name, 0) for name, value in moments.items()) / GIB

    extra = extra_bytes(case, spec, training)
    rest, head_dq, _, kept = parts(case, spec, training)
    quiet = {**case, "publisher_code": [n for n in case["publisher_code"] if n not in ("bnb_ctx_keeps_input", LONGEST_FIRST)]}
    return dict(id=case["id"], published=pm.published_bytes(case) / GIB, before=max(moments.values()) / GIB,
                rest=rest / GIB, head_dq=head_dq / GIB, kept=kept / GIB, after=peak(extra),
                moment=max(moments, key=lambda name: moments[name] + extra.get(name, 0)),
                one_iteration=peak(extra_bytes(case, spec, training, previous_iteration=False)),
                without_kept=peak(extra_bytes(quiet, spec, training)))


def main() -> None:
    """Print, per case with ``publisher_code``, the published peak, the estimate before and after, and
    what the mechanisms add at the winning moment (GiB)."""
    import json

    from profiles import PROFILES_DIR

    cases = [c for c in json.loads((PROFILES_DIR / "published_memory.json").read_text())["cases"] if c.get("publisher_code")]
    fsdp1 = [c for c in cases if FSDP1_NO_SYNC in c["publisher_code"]]
    held = [c for c in cases if FP32_LOGITS_HELD in c["publisher_code"]]
    shifted = [c for c in cases if SHIFT_COPY in c["publisher_code"]]
    around = [c for c in cases if CKPT_AROUND_FSDP1 in c["publisher_code"]]
    cases = [c for c in cases if c not in fsdp1 and c not in held and c not in shifted and c not in around]
    print("| case | published | estimate before | gap | head at rest | head dequantised | kept inputs / iteration "
          "| after (winning moment) | error before -> after | kept: this iteration only | no kept inputs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for case in cases:
        r = breakdown(case)
        err = lambda v: f"{100 * (v - r['published']) / r['published']:+.1f}%"  # noqa: E731
        print(f"| {r['id']} | {r['published']:.2f} | {r['before']:.2f} | {r['published'] - r['before']:+.2f} | {r['rest']:+.2f} | "
              f"{r['head_dq']:.2f} | {r['kept']:.2f} | {r['after']:.2f} ({r['moment']}) | {err(r['before'])} -> {err(r['after'])} | "
              f"{err(r['one_iteration'])} | {err(r['without_kept'])} |")
    if fsdp1:
        print()
        print("| case | published | estimate before (moment) | unsharded flat gradients held "
              "| block's backward beyond them | after (winning moment) | error before -> after |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for case in fsdp1:
        r = breakdown(case)
        plan = __import__("published_memory").plan_of(case)
        moments = plan.candidate(case["strategy"]).memory_bytes.moments
        extra = fsdp1_no_sync_bytes(case, plan.model, plan.training)
        err = lambda v: f"{100 * (v - r['published']) / r['published']:+.1f}%"  # noqa: E731
        print(f"| {r['id']} | {r['published']:.2f} | {r['before']:.2f} ({max(moments, key=moments.get)}) | "
              f"{extra['loss_backward'] / GIB:.2f} | {(extra['block_backward'] - extra['loss_backward']) / GIB:+.2f} | "
              f"{r['after']:.2f} ({r['moment']}) | {err(r['before'])} -> {err(r['after'])} |")

    _mechanism_table(held, FP32_LOGITS_HELD, "fp32 logits held (loss backward on)",
                     lambda case, spec, training: fp32_logits_held_bytes(case, spec)["loss_backward"])
    _mechanism_table(shifted, SHIFT_COPY, "shifted fp32 copy (loss forward)",
                     lambda case, spec, training: shift_copy_bytes(case, spec))
    _mechanism_table(around, CKPT_AROUND_FSDP1, "blocks' inputs' gradients held (bottom block's backward)",
                     lambda case, spec, training: checkpoint_around_fsdp1_bytes(case, spec, training)["block_backward"])


def _mechanism_table(cases: list[dict], name: str, column: str, bytes_of) -> None:
    """One table for the cases whose ``publisher_code`` holds the mechanism ``name``: the published figure, what
    ``bytes_of(case, spec, training)`` adds, and the compared estimate without and with it."""
    import published_memory as pm

    if cases:
        print()
        print(f"| case | kind | published | {column} | compared before -> after | error before -> after |")
        print("| --- | --- | ---: | ---: | --- | --- |")
    for case in cases:
        plan = pm.plan_of(case)
        quiet = {**case, "publisher_code": [n for n in case["publisher_code"] if n != name]}
        (_, before, _, _), (_, after, _, _) = (pm.estimate(c).compared(case["kind"]) for c in (quiet, case))
        truth = pm.published_bytes(case)
        err = lambda v: f"{100 * (v - truth) / truth:+.1f}%"  # noqa: E731
        print(f"| {case['id']} | {case['kind']} | {truth / GIB:.2f} | {bytes_of(case, plan.model, plan.training) / GIB:.2f} | "
              f"{before / GIB:.2f} -> {after / GIB:.2f} | {err(before)} -> {err(after)} |")


if __name__ == "__main__":
    main()
