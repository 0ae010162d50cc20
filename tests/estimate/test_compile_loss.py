"""A compiled cross-entropy (a stack that compiles its loss under --compile: torchtitan) against inductor's own
generated code, by hand, and in a plan."""

from __future__ import annotations

import pytest

from advisor.estimate.activations import Dtypes
from advisor.estimate.activations_loss import compiled_loss_bytes, loss_kept_bytes

BF16 = Dtypes(residual=2, compute=2, input_casts=False)


def test_inductor_allocates_no_fp32_logit_sized_buffer():
    """What compiled_loss_bytes rests on, read from the code inductor generates for F.cross_entropy(x.float(), y)
    on 512 x 4096 bf16 logits (CPU backend): the forward allocates per-token fp32 reductions and scalars only, the
    backward one per-token fp32 buffer and the gradient in the logits' dtype."""
    pytest.importorskip("torch._inductor")
    from benchmarks.compile_loss import compiled_buffers

    forward, backward = compiled_buffers(512, 4096)
    assert all(shape in ((512, 1), ()) for _, shape, _ in forward)
    assert sorted((shape, kind) for _, shape, kind in backward) == [((512, 1), "float32"), ((512, 4096), "bfloat16")]


def test_compiled_loss_by_hand():
    """8,192 tokens over a 128,256 vocabulary in bf16 (1,050,673,152 logits): the end of forward holds the logits,
    2 B each, and 2 x 4 B a token: 2,101,346,304 + 65,536 = 2,101,411,840; the loss backward the logits and their
    gradient: 4,202,692,608 + 65,536 = 4,202,758,144; kept for backward, as the end of forward."""
    assert compiled_loss_bytes(tokens=8192, vocab=128256, dt=BF16) == (2_101_411_840, 4_202_758_144)
    assert loss_kept_bytes("compiled", tokens=8192, vocab=128256, hidden=4096, dt=BF16) == 2_101_411_840


def test_torchtitan_compiles_its_loss_the_torch_recipe_does_not():
    """Llama-3.1-8B, zero3 on 8 x H100, 1 x 8192 tokens, full checkpointing: under --compile torchtitan's recipe
    compiles the loss, so its end of forward holds 8 bytes a logit less less 8 a token: 8,192 x (8 x 128,256 - 8)
    = 8,405,319,680; the torch recipe (wrap(): the blocks only) is unchanged by --compile there."""
    import advisor
    from advisor.hardware.cluster import parse_gpus

    def end(recipe: str, compile: bool) -> int:
        plan = advisor.plan("meta-llama/Llama-3.1-8B", parse_gpus("8xH100-80GB-SXM"), strategy="zero3",
                            micro_batch_size=1, seq_len=8192, activation_checkpointing="on", recipe=recipe,
                            compile=compile)
        return plan.candidate("zero3").memory_bytes.moments["end_of_forward"]

    assert end("torchtitan", False) - end("torchtitan", True) == 8_405_319_680
    assert end("torch", False) == end("torch", True)
