"""Activation offloading (``--activation-offload``): saved activations go to CPU memory in forward and come
back in backward, as torchtune's ``OffloadActivations`` (``enable_activation_offloading``) and TRL's copy of it
(``SFTConfig.activation_offloading``) run it. Read at torchtune 1814feb1 ``torchtune/training/
_activation_offloading.py``:

- A ``saved_tensors_hooks`` pair around the model's forward. Every saved tensor of at least 1,024 bytes that
  is not a parameter is copied to pinned CPU memory on a side stream; the GPU tensor is kept in a forward stash
  until five more tensors have been saved (``max_fwd_stash_size``), then dropped.
- The output head runs under a no-op hook (``NoOpManager``), so its saved input stays on the GPU, and the loss
  runs outside the context: the loss path is unchanged.
- Under non-reentrant checkpointing the hooks see only what autograd saves outside the checkpointed blocks:
  each block's input (``_NoopSaveInputs`` saves it with the outer hooks active) and the final norm's tensors.
  Without checkpointing they see every block's saved tensors.
- Backward brings a tensor back when its node runs and frees it once the next node has run; the forward stash
  is emptied by the first such node (the final norm's, before any block's).

So, per micro-batch, what leaves the GPU is each block's input under checkpointing, or each block's saved
tensors without it (``offloaded_per_block``). At the end of forward and through the loss none of them is on
the GPU (the stash then holds the final norm's last tensors, which the estimate keeps counted); in a block's
backward its own comes back, beside its recomputation. Checked against the simulated step, whose hooks do the
same with fake tensors (``advisor.simulate.offload``, ``tests/estimate/test_activation_offload.py``).

The bytes cross PCIe twice a micro-batch, out during forward and in during backward, on a side stream beside
the compute (``step_time``): exposed only where a direction's copy outlasts its compute. torchtune's own table
(README at 1814feb1, Llama 3.2 3B on an A100, checkpointed) measured -1.3 GiB active and -0.11% tokens/s.

Imports nothing heavy; the planning path reads it when the flag is on.
"""

from __future__ import annotations

from advisor.estimate.activations import ActivationEstimate, ActivationShape, Dtypes
from advisor.estimate.activations_blocks import block_input_in_layer_per_token
from advisor.frozen import validated_copy


def offloaded_per_block(est: ActivationEstimate, shape: ActivationShape, dt: Dtypes, *, tokens: int,
                        checkpointing: bool) -> int:
    """Bytes of one block a micro-batch moves to the CPU: its input (the residual stream, ``tokens`` x hidden)
    under checkpointing, every tensor it saved without (``block_kept_bytes``)."""
    return tokens * shape.hidden_size * dt.residual if checkpointing else est.block_kept_bytes


def offloaded_activations(est: ActivationEstimate, shape: ActivationShape, dt: Dtypes, *, tokens: int,
                          checkpointing: bool) -> ActivationEstimate:
    """``est`` with every block's offloaded bytes off the GPU at the end of forward. Under checkpointing a
    block's input comes back for its recomputation and is gone by its backward's peak unless an op of the block
    saves the input itself (``block_input_in_layer_per_token``: an fp32 residual's first RMSNorm, a LayerNorm):
    then it is live with the recomputed tensors (measured on the simulated step, bf16 and bf16-mixed). Without
    checkpointing each saved tensor comes back for its own node alone: nothing of the block is counted back."""
    block = offloaded_per_block(est, shape, dt, tokens=tokens, checkpointing=checkpointing)
    if block <= 0 or shape.num_layers < 1:
        return est
    back = tokens * block_input_in_layer_per_token(shape, dt) if checkpointing else 0
    # a frozen base's first block saves less than the others (``first_block_unsaved_per_token``): no more than
    # the blocks saved leaves
    moved = min(shape.num_layers * block, est.saved_bytes - est.outside_freed_bytes)
    return validated_copy(est, {"saved_bytes": est.saved_bytes - moved,
                                "recompute_bytes": est.recompute_bytes + back,
                                "block_kept_bytes": est.block_kept_bytes - block,
                                "mlp_freed_bytes": est.mlp_freed_bytes if checkpointing else 0,
                                "offloaded_bytes": moved})
