"""CUDA's SDPA kernel choice and its in-place sum of a tied gradient, made on the CPU
(``advisor.simulate.cuda_kernels``): against counts worked by hand and the H100's measurement. CPU only."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode

from advisor.simulate.cuda_kernels import cuda_grad_accumulation, cuda_sdpa, cuda_sdpa_kernel
from tests.saved_tensors import saved_forward_bytes


def _qkv(dtype: torch.dtype, heads: int, kv_heads: int, *, head_dim: int = 16, seq: int = 8):
    make = lambda h: torch.empty(1, h, seq, head_dim, dtype=dtype, device="meta")  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads)


@pytest.mark.parametrize("dtype, heads, kv_heads, mask, gqa, kernel", [
    (torch.float32, 4, 2, False, True, "math"),        # flash needs 16 bits, memory-efficient equal heads
    (torch.float32, 4, 1, False, True, "math"),        # MQA likewise
    (torch.float32, 4, 4, False, False, "efficient"),  # fp32 MHA
    (torch.float32, 4, 4, True, False, "efficient"),   # fp32 with a mask (transformers repeats k, v itself)
    (torch.bfloat16, 4, 2, False, True, "flash"),      # flash takes GQA
    (torch.float16, 4, 4, False, False, "flash"),
    (torch.bfloat16, 4, 4, True, False, "efficient"),  # a mask: not flash
    (torch.bfloat16, 4, 2, True, True, "math"),        # masked GQA (transformers does not pass it)
])
def test_kernel_choice_follows_select_sdp_backend(dtype, heads, kv_heads, mask, gqa, kernel):
    assert cuda_sdpa_kernel(*_qkv(dtype, heads, kv_heads), has_mask=mask, enable_gqa=gqa) == kernel


def test_fp32_head_dim_not_a_multiple_of_four_runs_math():
    """Memory-efficient attention's alignment on sm80+ (``minimum_gemm_alignment``: 128 bits)."""
    assert cuda_sdpa_kernel(*_qkv(torch.float32, 4, 4, head_dim=18), has_mask=False, enable_gqa=False) == "math"


def _saved_bytes(dtype: torch.dtype, heads: int, kv_heads: int, *, cuda: bool) -> int:
    """Distinct storages autograd saves for one causal SDPA call on fake tensors (b 1, s 8, d 16)."""
    sizes: dict[int, int] = {}

    def pack(tensor):
        sizes[id(tensor.untyped_storage())] = tensor.untyped_storage().nbytes()
        return tensor

    with FakeTensorMode():
        q, k, v = (torch.randn(1, h, 8, 16, dtype=dtype, requires_grad=True) for h in (heads, kv_heads, kv_heads))
        with cuda_sdpa() if cuda else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads < heads)
    return sum(sizes.values())


def test_fp32_gqa_saves_the_score_matrix_by_hand():
    """b 1, 4 heads, 2 key/value heads, s 8, d 16, fp32. CUDA's math kernel saves the scaled query
    (1 x 4 x 8 x 16 x 4 = 2,048), the repeated and scaled keys (2,048), the repeated values (2,048) and
    the s x s probabilities (4 heads x 8 x 8 x 4 = 1,024): 7,168. The CPU's flash kernel saves q (2,048),
    k and v unrepeated (1,024 each), the output (2,048) and the log-sum-exp (4 x 8 x 4 = 128): 6,272."""
    assert _saved_bytes(torch.float32, 4, 2, cuda=True) == 7_168
    assert _saved_bytes(torch.float32, 4, 2, cuda=False) == 6_272


def test_bf16_gqa_keeps_the_flash_kernel():
    """bf16: flash on CUDA as on the CPU, half of the CPU's fp32 count above but the fp32 log-sum-exp:
    2,048 + 2 x 1,024 + 2,048 (halved: 3,072) + 128 = 3,200."""
    assert _saved_bytes(torch.bfloat16, 4, 2, cuda=True) == _saved_bytes(torch.bfloat16, 4, 2, cuda=False) == 3_200


def test_fp32_gqa_under_autocast_keeps_the_flash_kernel():
    """Under autocast SDPA's inputs reach the kernel in the autocast dtype, so fp32 GQA inputs run flash,
    as the CPU's: the bf16 count above."""
    sizes: dict[int, int] = {}

    def pack(tensor):
        sizes[id(tensor.untyped_storage())] = tensor.untyped_storage().nbytes()
        return tensor

    with FakeTensorMode():
        q, k, v = (torch.randn(1, h, 8, 16, requires_grad=True) for h in (4, 2, 2))
        with cuda_sdpa(), torch.autocast("cpu", dtype=torch.bfloat16), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert sum(sizes.values()) == 3_200


def _llama_block_bytes_per_token(*, cuda: bool) -> float:
    """One Llama block's saved bytes a token (2 layers less 1), the block measured on the H100 (there at
    micro-batch 2; a token's bytes do not depend on the batch)."""
    batch, seq = 1, 128

    def saved(layers: int) -> int:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=layers,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=256, tie_word_embeddings=False,
                                       attn_implementation="sdpa")
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).float().train()
        ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
        with cuda_sdpa() if cuda else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return saved_forward_bytes(model, input_ids=ids)

    return (saved(2) - saved(1)) / (batch * seq)


def test_fp32_gqa_llama_block_saves_what_the_h100_saved():
    """The H100 (torch 2.11, transformers 5.17; tests/estimate/test_activations.py) measured 7,432 bytes a
    token for this fp32 block under SDPA, as under eager attention; the CPU's own kernel saves 5,144
    (``_llama_block_bytes_per_token(cuda=False)``, the simulator's count before ``cuda_sdpa``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _llama_block_bytes_per_token(cuda=True) == 7_432


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "fp32"])
def test_tied_gradient_summed_in_place_on_fake_tensors_where_a_gpu_does(autocast):
    """The rule of tests/estimate/test_ddp_backward_end.py (real tensors, no dispatch mode), on fake
    tensors: the tied matrix's summed gradient is the head's own storage under autocast (the cast node's
    fresh fp32 copy) and a new one without (the head's gradient is a transposed view)."""
    with FakeTensorMode(), cuda_grad_accumulation():
        weight = torch.nn.Parameter(torch.randn(512, 64))
        ids = torch.randint(0, 512, (16,))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = F.linear(F.embedding(ids, weight), weight)
        loss = logits.float().square().mean()
        head, stack = None, [loss.grad_fn]
        while stack:  # the head's last node before the matrix's AccumulateGrad
            head = stack.pop()
            nexts = [n for n, _ in head.next_functions if n is not None]
            if head.name() != "EmbeddingBackward0" and any(n.name() == "torch::autograd::AccumulateGrad" for n in nexts):
                break
            stack.extend(n for n in nexts if n.name() != "torch::autograd::AccumulateGrad")
        assert head.name() == ("ToCopyBackward0" if autocast else "TBackward0")
        # The gradients themselves are kept, so that neither storage is freed and its address reused before the
        # comparison (comparing id()s of temporary storage wrappers made this test flaky).
        kept: dict[str, torch.Tensor] = {}

        def keep(name: str, grad: torch.Tensor) -> None:
            kept.setdefault(name, grad)

        head.register_hook(lambda grad_in, grad_out: keep("head", grad_in[0]))
        weight.register_hook(lambda grad: keep("summed", grad))
        loss.backward()
        storages = {name: t.untyped_storage()._cdata for name, t in kept.items()}
    assert (storages["summed"] == storages["head"]) is autocast


def _grouped(dtype: torch.dtype, tokens: int = 12):
    """transformers' expert matmul shape: 2D tokens (t, 16) x 3D experts (4, 16, 24) with int32 offsets."""
    return (torch.empty(tokens, 16, dtype=dtype), torch.empty(4, 16, 24, dtype=dtype),
            torch.tensor([3, 6, 9, tokens], dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_grouped_mm_takes_cuda_dtypes_on_fake_tensors(dtype):
    """CUDA runs fp32 and fp16 grouped matmuls through its fallback (GroupedBlas.cpp); the meta function refuses
    them. The output is tokens x the experts' width in the inputs' dtype, and backward gives each input a
    gradient of its own shape."""
    from advisor.simulate.cuda_kernels import cuda_grouped_mm

    with FakeTensorMode() as mode, cuda_grouped_mm():
        tokens, experts, offs = _grouped(dtype)
        tokens.requires_grad_(), experts.requires_grad_()
        out = torch._grouped_mm(tokens, experts, offs=offs)
        out.backward(torch.ones_like(out))
    assert (tuple(out.shape), out.dtype) == ((12, 24), dtype)
    assert tokens.grad.shape == tokens.shape and experts.grad.shape == experts.shape


def test_grouped_mm_meta_function_alone_refuses_fp32():
    with FakeTensorMode():  # other shapes than above: the fake mode caches an op's output by its inputs' metadata
        tokens, experts, offs = _grouped(torch.float32, tokens=20)
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            torch._grouped_mm(tokens, experts, offs=offs)


def test_softmax_backward_holds_cuda_product_beside_its_output():
    """CUDA's ``_softmax_backward_data`` forms ``grad * output`` before its kernel writes the input's gradient
    (aten/src/ATen/native/cuda/SoftMax.cu); the H100 reached a step's peak inside that operator, one fp32 score
    tensor above what the CPU kernel holds (advisor.simulate.cuda_kernels). By hand, 8 x 256 x 256 fp32 scores:
    1 MiB each (2,097,152 bytes); under the tracker with ``cuda_softmax_backward`` the peak is one such tensor
    higher, and the gradient is unchanged."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from advisor.simulate.cuda_kernels import cuda_softmax_backward

    def peak(cuda: bool) -> tuple[int, torch.Tensor]:
        torch.manual_seed(0)
        scores = torch.randn(8, 256, 256, requires_grad=True)
        tracker = MemTracker()
        tracker.track_external(scores)
        with tracker, cuda_softmax_backward() if cuda else contextlib.nullcontext():
            probs = torch.softmax(scores, dim=-1)
            probs.backward(torch.ones_like(probs))
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"], scores.grad

    (cpu, cpu_grad), (cuda, cuda_grad) = peak(False), peak(True)
    assert cuda - cpu == 8 * 256 * 256 * 4 == 2_097_152
    assert torch.equal(cpu_grad, cuda_grad)
