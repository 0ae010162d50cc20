"""Mamba activations: the per-token count (``advisor.estimate.activations_ssm``) against what autograd
saves in one block of a real tiny MambaForCausalLM on the CPU (transformers' reference scan), and
the arithmetic of its dominant term worked by hand."""

from __future__ import annotations

import torch
import transformers

from advisor.estimate.activations import Dtypes, estimate_activations, shape_of
from advisor.estimate.activations_ssm import mamba_mixer_per_token
from advisor.model.kinds import SsmFacts
from advisor.model.sources import spec_from_config
from tests.saved_tensors import saved_forward_bytes

BATCH, SEQ = 2, 16
CFG = dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=64, state_size=8, conv_kernel=4,
           expand=2, time_step_rank=4, vocab_size=100)


def _saved_bytes(num_layers: int, dtype: torch.dtype) -> int:
    torch.manual_seed(0)
    config = transformers.MambaConfig(**{k: v for k, v in CFG.items() if k not in ("model_type", "architectures")},
                                      num_hidden_layers=num_layers)
    model = transformers.MambaForCausalLM(config).to(dtype).train()
    return saved_forward_bytes(model, input_ids=torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)))


def test_mamba_block_matches_what_autograd_saves():
    """bf16: 18,444 bytes a token measured; the count leaves out the rsqrt (4) and 400 bytes a token of
    per-layer constants at this tiny size (exp(A_log), D, the zero initial state): 2.2%. fp32 within 5%."""
    spec = spec_from_config({**CFG, "num_hidden_layers": 1}, name="mamba", source="local")
    for dtype, dtypes, low in ((torch.bfloat16, Dtypes(residual=2, compute=2, input_casts=False), 0.97),
                               (torch.float32, Dtypes(residual=4, compute=4, input_casts=False), 0.95)):
        measured = _saved_bytes(2, dtype) - _saved_bytes(1, dtype)
        est = estimate_activations(shape_of(spec), dtypes, micro_batch_size=BATCH, seq_len=SEQ, checkpointing=False,
                                   eager=False).layer_bytes
        assert low * measured <= est <= measured, (dtype, est, measured)


def test_scan_states_dominate_by_hand():
    """Mamba-130m's mixer (d_inner 1536, state 16, dt rank 48, conv 4) in bf16 at seq 2048, by hand:
    exp(delta A) and delta B u, 4 x 1536 x 16 = 98,304 bytes each; the kept states 98,304 x 2047 / 2048
    = 98,256 and their bf16 casts 49,152; fp32 copies of B and u 4 x (16 + 1536) = 6,208: the scan
    350,224. Eight 1536-wide bf16 tensors 24,576, x_proj's output 2 x (48 + 32) = 160, the padded conv
    output 2 x 1536 x 2051 / 2048 = 3,076 (floored), the fp32 scan output 6,144: 384,180 in all."""
    ssm = SsmFacts(state_size=16, conv_kernel=4, time_step_rank=48)
    assert mamba_mixer_per_token(2, hidden=768, inner=1536, ssm=ssm, seq_len=2048) == 384_180
