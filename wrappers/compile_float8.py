"""The plan's --compile and --float8 applied to a live model: per-block torch.compile and torchao float8.

As torchtitan applies them (``torchtitan/models/llama3/infra/parallelize.py`` at v0.2.2, commit 73a0e697):
float8 first (``Float8LinearConverter``: ``convert_to_float8_training`` on every ``nn.Linear`` whose
dimensions are both multiples of 16, the head ``output`` excluded), then ``apply_compile``: each decoder block
compiled on its own (``block.compile()``, inductor), the per-block compile ``advisor.estimate.compile_time``
counts. torchao is optional: float8 without it is a one-line error naming the package.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec

from torch import nn

from wrappers.blocks import find_blocks

_FLOAT8_DIM_MULTIPLE = 16  # torch._scaled_mm needs both dims divisible by 16 (torchtitan float8.py filter)


def float8_filter(blocks: list[nn.Module]) -> Callable[[nn.Module, str], bool]:
    """``module_filter_fn(module, fqn)`` for torchao: a block's ``nn.Linear`` with both dims multiples of 16.

    Linears outside ``blocks`` (the head, embeddings' projections) stay in the compute dtype."""
    inside = {id(m) for block in blocks for m in block.modules() if isinstance(m, nn.Linear)}

    def keep(module: nn.Module, fqn: str) -> bool:
        return (isinstance(module, nn.Linear) and id(module) in inside
                and module.in_features % _FLOAT8_DIM_MULTIPLE == 0
                and module.out_features % _FLOAT8_DIM_MULTIPLE == 0)
    return keep


def apply_float8(model: nn.Module, *, all_gather: bool = False) -> nn.Module:
    """Swap the blocks' linears for torchao ``Float8Linear`` (tensorwise dynamic scaling), in place."""
    if find_spec("torchao") is None:
        raise ImportError("--float8 needs torchao (pip install torchao): it is not installed")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather)
    return convert_to_float8_training(model, config=config, module_filter_fn=float8_filter(find_blocks(model)))


def apply_compile(model: nn.Module) -> list[nn.Module]:
    """``torch.compile`` each decoder block in place (``nn.Module.compile``: the module keeps its identity, so
    FSDP/DDP wrap it as before); compilation itself happens at the first forward. Returns the blocks."""
    blocks = find_blocks(model)
    for block in blocks:
        block.compile(backend="inductor")
    return blocks
