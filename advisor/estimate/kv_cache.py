"""What a Hugging Face model's KV cache costs in training, when the stack leaves it on (``--use-cache``).

What belongs here: the bytes the cache adds at the moments of the step, from the activation shape and the
recipe's dtypes. What does not: whether a stack leaves the cache on (the recipe facts, profiles/recipes.json,
and ``TrainingConfig.use_cache``), the activations without it (``advisor.estimate.activations``).

How the cache comes to exist in training (transformers 5.23): ``LlamaModel.forward`` builds a ``DynamicCache``
whenever ``use_cache`` is true, and ``merge_with_config_defaults`` (utils/generic.py) fills it from
``config.use_cache`` (True in the Llama, Qwen2, Mistral configs) unless ``self.gradient_checkpointing`` and
``self.training``; ``GradientCheckpointingLayer`` (modeling_layers.py) drops it too. So transformers'
``gradient_checkpointing_enable`` turns it off, HF Trainer sets ``config.use_cache = args.use_cache`` (False
by default: trainer.py, TrainingArguments.use_cache) and ``wrap()`` turns it off with its checkpointing
(wrappers/checkpointing.py). torch's ``checkpoint_wrapper`` does not: accelerate's FSDP
``activation_checkpointing`` (utils/fsdp_utils.py ``fsdp2_apply_ac``) and Lightning's FSDP
``activation_checkpointing_policy`` wrap the blocks with it and leave ``config.use_cache`` as loaded.

What the cache holds: ``DynamicLayer.update`` (cache_utils.py) is ``torch.cat([self.keys, key_states])``,
a copy of each layer's rotated keys and of its values. The rotated keys are in the residual stream's dtype
(the rotary tables come in it, ``cos.to(x.dtype)``), so under autocast over fp32 weights the cached keys
are fp32 while SDPA saves its own bf16 casts. The values depend on the release (profiles/library_releases.json,
``kv_cache_values_keep_their_dtype``; the resolver puts it in ``ModelSpec.kv_cache_values_own_dtype``):
before transformers 5.24 ``lazy_initialization`` made both empty tensors in the keys' dtype, so ``torch.cat``
promoted the bf16 values to an fp32 copy too; from 5.24 the values keep their own dtype, bf16 under autocast,
and the cached values are the very tensor SDPA saves (autocast's cast of a bf16 tensor is itself). Without
autocast (fp32, pure bf16, FSDP2's MixedPrecisionPolicy) both releases cache the tensors SDPA saves, and
they cost nothing more while both live. Each tensor below counts apart: a copy, or shared with what SDPA saves.
The loop (``loss = model(**batch).loss``) drops the output, and with it the cache, before the backward,
unless checkpointing holds it:

- without checkpointing, an fp32 cache beside bf16 casts is live through the forward and the loss
  (``end_of_forward``), then freed;
- under ``checkpoint_wrapper`` every checkpointed block's recompute closure holds the cache (its
  ``past_key_values`` argument, ``cache`` from 5.24) until that block's backward, so it lives from the
  forward to the bottom block's backward: each layer's K/V at the loss, and in the blocks' backward the
  recomputation appends the layer's keys and values a second time (a 2s-long tensor per recomputed
  layer; SDPA's ``is_causal`` path slices the first s, so the step runs and its gradients are right). The
  2s tensor's ``grad_fn`` keeps the recomputed key/value path alive too: the block input's fp32 copy, the
  attention norm's saved tensors and ``rsqrt``, and under autocast the k and v projections' bf16 input and
  weight casts.

Measured on the simulated step (``advisor.simulate``, tests/estimate/test_kv_cache.py): a 256-wide GQA Llama
(8 heads, 2 KV heads), micro-batch 2, s 1024, bf16-mixed, checkpointing on: +10,559,488 bytes at 2 layers
and +19,021,824 at 3 layers over the same step without the cache, both exactly this count (transformers
5.23); a 128-wide one, micro-batch 2, s 512, 2 layers: +3,706,880 on 5.23.0 and +3,051,520 on 5.24.0. Eager attention
cannot run it (its (b, 1, s, s) mask meets 2s keys in the recompute: a shape error), nor can a masked SDPA, nor
selective checkpointing (torch.utils.checkpoint: "aten.slice.Tensor ... encountered during backward but not
found in storage"). Data-parallel plans only: the mesh and pipeline estimates do not count the cache yet.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from advisor.estimate.activations import ActivationShape, Dtypes
from advisor.estimate.activations_blocks import cuda_math_sdpa, rms_norm_per_token
from advisor.precision import FP32


class KvCacheBytes(BaseModel):
    """Bytes the cache adds to the step's moments (0 where it costs nothing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    end_of_forward: int = Field(ge=0, description="Every layer's cached K/V beyond what autograd saves, "
                                "at the loss.")
    loss_backward: int = Field(ge=0, description="The same while the loss's backward runs (checkpointing "
                               "holds the cache; without it the loop has dropped the output).")
    block_backward_top: int = Field(ge=0, description="At the top block's backward: the lower layers' "
                                    "K/V and the top layer's appended again.")
    block_backward_bottom: int = Field(ge=0, description="At the bottom block's backward: its K/V appended "
                                       "again, and every recomputed layer's 2s K/V and retained key/value path.")


def kv_cache_not_modelled(shape: ActivationShape, *, eager: bool, lora: bool, checkpointing: bool,
                          selective: bool = False) -> str | None:
    """Why ``--use-cache`` cannot be estimated for this job; None when it can."""
    if shape.family != "decoder" or shape.mla is not None or shape.fused_qkv or shape.sandwich_norms:
        return "--use-cache is modelled for Llama-style decoders (RMSNorm, separate k and v projections)"
    if lora:
        return "--use-cache is not modelled with LoRA yet (a frozen norm saves other tensors)"
    if selective:  # simulated: torch.utils.checkpoint raises, the recomputation runs a slice the forward did not
        return ("a kept KV cache fails under selective checkpointing (the recomputation appends the keys again "
                "and runs ops the forward did not); turn the cache off (model.config.use_cache = False)")
    if checkpointing and (eager or shape.sliding_window is not None):
        return ("a kept KV cache fails in the checkpointed recomputation with a (b, 1, s, s) attention mask "
                "(eager attention, a sliding window): the mask meets 2s keys; turn the cache off "
                "(model.config.use_cache = False)")
    return None


def estimate_kv_cache(shape: ActivationShape, dt: Dtypes, *, micro_batch_size: int, seq_len: int,
                      checkpointing: bool, eager: bool, values_own_dtype: bool) -> KvCacheBytes:
    """The cache's bytes at each moment (module docstring), for a job ``kv_cache_not_modelled`` accepts.
    ``values_own_dtype``: the release keeps the values in their own dtype (transformers >= 5.24)."""
    tokens = micro_batch_size * seq_len
    h, kv_width = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    # one layer's keys (the rotated keys' dtype, the residual stream's) and values of every token
    value_bytes = dt.compute if values_own_dtype else dt.residual  # v_proj's output is a matmul's (compute)
    layer_k, layer_v = tokens * kv_width * dt.residual, tokens * kv_width * value_bytes
    layer_kv = layer_k + layer_v
    # SDPA saves a cached tensor itself where nothing casts it (and, GQA, takes it unrepeated); eager
    # attention, and CUDA's math SDPA (fp32 with GQA), save repeated copies: the cache is a copy even then.
    gqa = shape.num_kv_heads < shape.num_attention_heads
    copies = (eager and gqa) or cuda_math_sdpa(shape, dt)
    k_shared = dt.residual == dt.compute and not copies
    v_shared = value_bytes == dt.compute and not copies
    if not checkpointing:
        forward = shape.num_layers * ((0 if k_shared else layer_k) + (0 if v_shared else layer_v))
        return KvCacheBytes(end_of_forward=forward, loss_backward=0, block_backward_top=0, block_backward_bottom=0)
    forward = shape.num_layers * layer_kv  # checkpointing saved nothing of a block: the cache is all extra
    # the layer being recomputed: its 2s tensors beyond the s SDPA saves of them (all 2s where SDPA saves a cast)
    own = (layer_k if k_shared else 2 * layer_k) + (layer_v if v_shared else 2 * layer_v)
    retained = tokens * (rms_norm_per_token(h, dt) + FP32 + (2 * dt.compute * h if dt.input_casts else 0))
    retained += 2 * h * kv_width * dt.compute if dt.input_casts else 0  # autocast's k/v weight casts
    finished = 2 * layer_kv + retained  # a recomputed layer, its backward done: 2s K/V and its key/value path
    return KvCacheBytes(end_of_forward=forward, loss_backward=forward,
                        block_backward_top=(shape.num_layers - 1) * layer_kv + own,
                        block_backward_bottom=own + (shape.num_layers - 1) * finished)
