"""One way to measure activations for the per-block tests: the bytes of distinct storages autograd
saves in one training forward, parameters excluded, with CUDA's dropout emulated on the CPU as the
simulator runs it (``advisor.simulate.fake_env.cuda_dropout``)."""

from __future__ import annotations

import gc
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.simulate.fake_env import cuda_dropout


def saved_forward_bytes(model: torch.nn.Module, *, autocast: bool = False, **inputs) -> int:
    """Counted once the forward has returned, with its output still held: only what the graph keeps
    (a tensor saved by a branch the output does not depend on is freed, and its address may be reused
    by a later one: counting at pack time by address was order- and allocator-dependent). ``autocast``:
    the forward under CPU autocast to bf16 (weights kept in their own dtype)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    aliases = []

    def pack(tensor):
        alias = tensor.detach()  # a handle that lives exactly as long as the graph keeps the tensor
        aliases.append(weakref.ref(alias))
        return alias

    with cuda_dropout(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**inputs)
    gc.collect()
    alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (r() for r in aliases)
             if t is not None and t.untyped_storage().data_ptr() not in weights}
    del out
    return sum(alive.values())


def qwen_tower_saved_bytes(tower_class: type, config, dtype: torch.dtype, grid: int) -> int:
    """``saved_forward_bytes`` of a Qwen2-VL / Qwen2.5-VL vision tower (SDPA) built from ``config`` in
    ``dtype`` over one image of ``grid`` x ``grid`` patches (3 channels, flattened as the processor does)."""
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = tower_class._from_config(config).to(dtype).train()
    width = 3 * config.temporal_patch_size * config.patch_size ** 2
    pixels = torch.randn(grid * grid, width, dtype=dtype, generator=torch.Generator().manual_seed(0))
    return saved_forward_bytes(tower, hidden_states=pixels, grid_thw=torch.tensor([[1, grid, grid]]))


def _key(t: torch.Tensor):
    return StorageWeakRef(t.untyped_storage())


class _Writers(TorchDispatchMode):
    """Which op wrote each storage (the first op to return it), and which storages are made from the weights
    alone (``weights``, seeded with the parameters': autocast's weight casts, not per token)."""

    def __init__(self, weights: set):
        super().__init__()
        self.op, self.weights = {}, set(weights)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        from_weights = bool(inputs) and all(_key(t) in self.weights for t in inputs)
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and _key(t) not in self.op:
                self.op[_key(t)] = func.__name__
                if from_weights:
                    self.weights.add(_key(t))
        return out


def fake_llama_block(shape: dict, *, batch: int, seq: int, autocast: bool = False):
    """(layer on the meta device, fake params, fake x, fake cos, fake sin, the fake mode): bf16, or fp32 for
    ``autocast`` (fp32 weights, an fp32 residual stream and fp32 cos/sin, as HF casts them to the hidden dtype)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(**shape, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        layer = LlamaDecoderLayer(config, 0).to(torch.float32 if autocast else torch.bfloat16).train()
    mode = FakeTensorMode()
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    with mode:
        params = {n: torch.empty(p.shape, dtype=p.dtype).requires_grad_() for n, p in layer.named_parameters()}
        dtype = torch.float32 if autocast else torch.bfloat16
        x = torch.empty(batch, seq, shape["hidden_size"], dtype=dtype).requires_grad_()
        cos = torch.empty(1, seq, head_dim, dtype=dtype)
        sin = torch.empty(1, seq, head_dim, dtype=dtype)
    return layer, params, x, cos, sin, mode


def _call(layer, params, x, cos, sin, autocast: bool = False):
    """The layer's forward; ``autocast``: under CPU autocast to bf16 with CUDA's fp32 op list (the simulator's)."""
    import contextlib

    from advisor.simulate.autocast import cuda_fp32_policy

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
            cuda_fp32_policy() if autocast else contextlib.nullcontext():
        return torch.func.functional_call(layer, params, (x,), {"position_embeddings": (cos, sin)})


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def eager_saved(shape: dict, *, batch: int, seq: int, autocast: bool = False) -> list[tuple[str, tuple, torch.dtype, int]]:
    """(op, shape, dtype, bytes) of each distinct storage the eager forward leaves saved."""
    layer, params, x, cos, sin, mode = fake_llama_block(shape, batch=batch, seq=seq, autocast=autocast)
    skip = {_key(t) for t in (*params.values(), cos, sin)}
    packed = []
    with mode:
        writers = _Writers({_key(t) for t in params.values()})
        with writers, torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
            out = _call(layer, params, x, cos, sin, autocast)
        seen, rows = set(), []
        for t in packed:
            k = _key(t)
            if k in skip or k in seen or k in writers.weights:
                continue
            seen.add(k)
            rows.append((writers.op.get(k, "input"), tuple(t.shape), t.dtype, _nbytes(t)))
        del out
    return rows


def graph_recorder():
    """(graphs, keep): ``keep(name)`` is an AOTAutograd compiler that stores the graph it is handed under ``name``
    in ``graphs`` and runs it unchanged."""
    from functorch.compile import make_boxed_func

    graphs: dict = {}

    def keep(name):
        def compiler(gm, _inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    return graphs, keep


def inductor_saved(fn, x: torch.Tensor, *, skip_shapes: set, input_label: str = "input") -> list[tuple[str, torch.Tensor]]:
    """(label, value) of each tensor the forward graph of ``torch.compile(fn)`` saves for backward, compiled through an
    ``aot_autograd`` backend on inductor's decompositions and ``partition_fn`` whose compilers return the graphs:
    the forward graph's outputs beyond the user's output (the backward graph's inputs other than its tangents),
    shapes in ``skip_shapes`` left out. Labelled by the op (and node) that made each, ``input_label`` for a graph
    input. Real tensors (dynamo does not take fake inputs here)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    graphs, keep = graph_recorder()
    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"), partition_fn=partition_fn,
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(x).sum().backward()
    nodes = list(graphs["fw"].graph.nodes)
    tangents = sum(1 for n in graphs["bw"].graph.nodes if n.op == "placeholder" and n.name.startswith("tangents"))
    out = []
    for node in nodes[-1].args[0][tangents:]:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and tuple(val.shape) not in skip_shapes:
            out.append((f"{node.target if node.op == 'call_function' else input_label} ({node.name})", val))
    return out


def compiled_saved(shape: dict, *, batch: int, seq: int, inductor: bool = True, autocast: bool = False) -> list[tuple[str, tuple, torch.dtype, int]]:
    """(op, shape, dtype, bytes) of each distinct storage the partitioned forward graph saves for backward.
    ``inductor``: inductor's decompositions and partition_fn (its joint-graph passes first); False: the bare
    ``min_cut_rematerialization_partition(compiler="inductor")`` without decompositions, which saves the same
    tensors of this block (checked at 256 wide, 1 x 128 tokens) and needs no inductor import (seconds faster)."""
    import functools

    from functorch.compile import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    if inductor:
        from torch._inductor.compile_fx import partition_fn
        from torch._inductor.decomposition import select_decomp_table

        partition, decompositions = partition_fn, select_decomp_table()
    else:
        partition, decompositions = functools.partial(min_cut_rematerialization_partition, compiler="inductor"), None

    layer, params, x, cos, sin, mode = fake_llama_block(shape, batch=batch, seq=seq, autocast=autocast)
    graphs, keep = graph_recorder()
    with mode:
        fn = aot_function(lambda p, x, c, s: _call(layer, p, x, c, s, autocast), fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                          partition_fn=partition, decompositions=decompositions)
        out = fn(params, x, cos, sin)
        out.sum().backward()
    fw_nodes = list(graphs["fw"].graph.nodes)
    placeholders = [n for n in fw_nodes if n.op == "placeholder"]
    num_params = len(params)
    # aot_function flattens (params, x, cos, sin): the params first, then x, cos, sin
    skip = {_key(n.meta["val"]) for n in placeholders[:num_params]}
    skip |= {_key(n.meta["val"]) for n in placeholders[num_params + 1:]}
    weights = {n for n in placeholders[:num_params]}
    for n in fw_nodes:  # made from the weights alone (autocast's weight casts and their views): not per token
        inputs = [a for a in n.all_input_nodes]
        if n.op == "call_function" and inputs and all(a in weights for a in inputs):
            weights.add(n)
    tangents = sum(1 for n in graphs["bw"].graph.nodes if n.op == "placeholder" and n.name.startswith("tangents"))
    outputs = fw_nodes[-1].args[0]
    seen, rows = set(), []
    for node in outputs[tangents:]:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        k = _key(val)
        if k in skip or k in seen or node in weights:
            continue
        seen.add(k)
        op = "input x" if node.op == "placeholder" else str(node.target).replace("aten.", "")
        rows.append((f"{op} ({node.name})", tuple(val.shape), val.dtype, _nbytes(val)))
    return rows


def add_block_shape_arguments(parser) -> None:
    """The Llama block's shape, as benchmarks/compile_saved_sac.py and compile_saved_lora.py take it (an
    ``argparse.ArgumentParser``): hidden, intermediate, heads, KV heads and sequence, small by default."""
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=704)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
