"""Expert parallelism for real: an MoE block of three Hugging Face families (Mixtral, Qwen2-MoE,
DeepSeek-V3) with its experts sharded over ep 2 gloo ranks, against the unsharded block in one process.

One spawn (two ranks) runs every family; each rank feeds its own half of the tokens, as data-parallel
ranks do. Compared: each rank's output on its tokens; the gradients of its local experts (which
collect both ranks' tokens through the all-to-all's backward) against the matching rows of the
unsharded experts' gradients; the replicated router's (and shared experts') gradients summed over the
ranks. The loss is a sum, so the ranks' gradients add up to the one-process gradient exactly.

Tolerance: atol 1e-6, rtol 1e-5 (float32). The sharded block adds the same products in another
order (top-k choices combined after the exchange instead of expert by expert); a token routed to the
wrong expert or a missing combine weight moves outputs by about their own size (1e-1 here).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tests.wrappers._dist import assert_params_close, collect_distributed, max_abs_diff

from wrappers.experts import apply_expert_parallel, expert_layout_problem

EP = 2
TOKENS_PER_RANK = 6
HIDDEN = 32
RTOL, ATOL = 1e-5, 1e-6
FAMILIES = ("mixtral", "qwen2_moe", "deepseek_v3")


def moe_block(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny MoE block of ``family`` (4 routed experts, top-2), weights drawn from ``seed``."""
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block

        config = MixtralConfig(hidden_size=HIDDEN, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
    elif family == "qwen2_moe":
        from transformers import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock as Block

        config = Qwen2MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                num_experts=4, num_experts_per_tok=2)
    else:
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as Block

        config = DeepseekV3Config(hidden_size=HIDDEN, moe_intermediate_size=16, n_routed_experts=4, n_shared_experts=1,
                                  num_experts_per_tok=2, n_group=2, topk_group=1)
    torch.manual_seed(seed)
    block = Block(config)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, 0.2)
        for buffer in block.buffers():
            buffer.normal_(0.0, 0.05) if buffer.is_floating_point() else None
    return block


def _tokens_and_weights() -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states [ep, tokens, hidden] (rank r feeds row r) and the fixed loss weights."""
    generator = torch.Generator().manual_seed(7)
    shape = (EP, TOKENS_PER_RANK, HIDDEN)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _run(block: torch.nn.Module, rows: slice) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    hidden, weights = _tokens_and_weights()
    out = block(hidden[rows])
    (out * weights[rows]).sum().backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in block.named_parameters()}


def _saved_by_the_sharded_experts() -> int:
    """Bytes autograd keeps from one forward of this rank's sharded Mixtral experts, on balanced routing: each
    rank's token t picks experts 2t and 2t + 1 (mod 4), so every expert gets 3 rows from each rank and each
    rank receives k x tokens = 12 rows, as many as it sends."""
    from tests.saved_tensors import saved_forward_bytes

    block = moe_block("mixtral")
    apply_expert_parallel(block, dist.group.WORLD)
    hidden = torch.randn(TOKENS_PER_RANK, HIDDEN, requires_grad=True)
    chosen = torch.tensor([[(2 * t) % 4, (2 * t + 1) % 4] for t in range(TOKENS_PER_RANK)])
    weights = torch.rand(TOKENS_PER_RANK, 2, requires_grad=True)  # the router's output: it has a gradient
    return saved_forward_bytes(block.experts, hidden_states=hidden, top_k_index=chosen, top_k_weights=weights)


def _ep_ranks(rank: int, world_size: int) -> dict:
    results = {"saved": _saved_by_the_sharded_experts()}
    for family in FAMILIES:
        block = moe_block(family)
        apply_expert_parallel(block, dist.group.WORLD)
        out, grads = _run(block, slice(rank, rank + 1))
        for name, grad in grads.items():
            if not name.startswith("experts."):  # replicated: each rank holds its tokens' share
                dist.all_reduce(grad)
        results[family] = {"out": out, "grads": grads, "local": block.experts.gate_up_proj.shape[0]}
    return results


@pytest.fixture(scope="module")
def ep_results() -> list[dict]:
    return collect_distributed(_ep_ranks, world_size=EP, timeout_s=120)


@pytest.mark.parametrize("family", FAMILIES)
def test_ep2_block_matches_one_process(ep_results, family):
    reference_out, reference_grads = _run(moe_block(family), slice(None))
    worst = 0.0
    for rank, result in enumerate(ep_results):
        got = result[family]
        assert got["local"] == 2  # 4 experts over 2 ranks
        torch.testing.assert_close(got["out"], reference_out[rank : rank + 1], rtol=RTOL, atol=ATOL)
        local = slice(rank * 2, rank * 2 + 2)
        expected = {n: g[local] if n.startswith("experts.") else g for n, g in reference_grads.items()}
        grads_diff = assert_params_close(got["grads"], expected, rtol=RTOL, atol=ATOL, label=f"{family} rank {rank}")
        worst = max(worst, grads_diff, max_abs_diff({"out": got["out"]}, {"out": reference_out[rank : rank + 1]}))
    print(f"{family}: max |diff| {worst:.2e} (outputs and gradients)")


def test_the_sharded_experts_keep_what_the_simulator_counts(ep_results):
    """The combine sums the k choices as transformers does and keeps no weighted rows (index_add kept its
    source: 12 x 32 x 4 = 1,536 bytes more here). Per routed row, fp32, h 32, I 16: the sorted received row
    (h), gate and up (2I), SiLU (I) and the product (I), the returned row (h), its router weight (4 bytes) and
    five int64 indices (token of the row, sort by local expert and its inverse, expert order and its inverse).
    advisor.simulate.moe_layer runs the same path (tests/simulate/test_moe_layer.py: its HELD less the router)."""
    rows, h, inter = 2 * TOKENS_PER_RANK, HIDDEN, 16
    per_row = 4 * (2 * h + 4 * inter) + 4 + 5 * 8
    assert per_row * rows == 6672
    assert [result["saved"] for result in ep_results] == [6672, 6672]


def test_gpt_oss_experts_are_refused():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    block = GptOssMLP(GptOssConfig(hidden_size=HIDDEN, intermediate_size=16, num_local_experts=4))
    assert "is_transposed" in expert_layout_problem(block.experts)
    with pytest.raises(ValueError, match="another weight layout"):
        apply_expert_parallel(block, group=None)


def test_a_block_without_experts_is_refused():
    with pytest.raises(ValueError, match="no fused experts module"):
        apply_expert_parallel(torch.nn.Linear(4, 4), group=None)
