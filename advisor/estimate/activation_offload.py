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
- Backward brings a tensor back when its node runs and frees it once the next node has run; the forward stash
  is emptied by the first such node (the final norm's, before any block's).

Planned under activation checkpointing only, as torchtune requires (its recipes raise without it): what leaves
the GPU is then each block's input. Without checkpointing every saved tensor would cross PCIe and a node's own
(an eager attention's s x s probabilities) would come back whole at its backward: not modelled, refused
(``advisor.training``, and the planner tries no plan without checkpointing under the flag).

The bytes cross PCIe twice a micro-batch, out during forward and in during backward, on a side stream beside
the compute (``step_time``): exposed only where a direction's copy outlasts its compute. torchtune's own table
(README at 1814feb1, Llama 3.2 3B on an A100, checkpointed) measured -1.3 GiB active and -0.11% tokens/s.
Checked against the simulated step, whose hooks (``wrappers.activation_offload`` with ``host=False``) drop each
tensor and make it again in backward (``benchmarks/accuracy_offload.py``, ``tests/estimate/
test_activation_offload.py``).

Imports nothing heavy; the planning path reads it when the flag is on.
"""

from __future__ import annotations

from advisor.estimate.activations import ActivationEstimate, ActivationShape, Dtypes
from advisor.estimate.activations_blocks import block_input_in_layer_per_token
from advisor.frozen import validated_copy
from advisor.training import OFFLOAD_NEEDS_CHECKPOINTING

def offloaded_activations(est: ActivationEstimate, shape: ActivationShape, dt: Dtypes, *, tokens: int,
                          checkpointing: bool, frozen: bool = False) -> ActivationEstimate:
    """``est`` with every checkpointed block's input (``tokens`` x hidden in the residual dtype) in CPU memory
    (``offloaded_bytes``) instead of saved on the GPU. ``frozen``: a frozen base (LoRA). ValueError without
    checkpointing (module docstring)."""
    if not checkpointing:
        raise ValueError(OFFLOAD_NEEDS_CHECKPOINTING)
    block = tokens * shape.hidden_size * dt.residual
    if block <= 0 or shape.num_layers < 1:
        return est
    # A frozen base's final norm saves fewer tensors than the stash holds (its weight needs no gradient), so the last
    # block's input is still in the forward stash through the loss, until the norm's backward empties it: counted as
    # saved and gone before any block's backward (``outside_freed_bytes``). A trained norm's tensors push it out.
    stays = block if frozen else 0
    # In a block's backward its input is back (for the recomputation) and live at the peak where an op of the block
    # saved the input itself (``block_input_in_layer_per_token``: an fp32 residual's first RMSNorm, a LayerNorm), and
    # under LoRA (read on the simulated step: within one block input of it either way).
    back = tokens * (shape.hidden_size * dt.residual if frozen else block_input_in_layer_per_token(shape, dt))
    # no more than the blocks saved leaves (a frozen base's first block saves less: first_block_unsaved_per_token)
    moved = min(shape.num_layers * block, est.saved_bytes - est.outside_freed_bytes)
    return validated_copy(est, {"saved_bytes": est.saved_bytes - moved + stays,
                                "outside_freed_bytes": est.outside_freed_bytes + stays,
                                "recompute_bytes": est.recompute_bytes + back,
                                "block_kept_bytes": est.block_kept_bytes - block,
                                "offloaded_bytes": moved})
