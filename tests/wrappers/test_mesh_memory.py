"""Peak host memory of ``wrap()`` loading a meta-device model from safetensors on 4 gloo ranks.

The model: a Llama of 61,879,296 parameters (hidden 1024, 6 layers, 16 heads, 4 KV heads, MLP 2048,
vocabulary 4096, untied), 247.5 MB in fp32, written as one ``model.safetensors``. Under TP 2 x FSDP 2
every weight matrix (the embedding and head too: transformers' plan splits them by vocabulary) is
split four ways, so a rank owns about a quarter, 62 MB; reading adds one tensor's slice at a time
(the copy out of the memory map, and for row-wise weights the map's pages of the rows it reads).

Measured as the rise of the process's resident set high-water mark during ``wrap()``: Linux resets
``VmHWM`` when 5 is written to ``/proc/self/clear_refs`` (proc(5)), so the peak is the load's own and
not the imports'. Bound: 0.5 x the model. A process that built or loaded the whole model would rise
by at least 1x; the quarter it owns plus one tensor's read buffers and the allocator's slack stays
well under half.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.wrappers._dist import launch_env, run_distributed

from advisor.mesh import ParallelDims

CONFIG = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=16,
              num_key_value_heads=4, vocab_size=4096, max_position_embeddings=128, tie_word_embeddings=False)
# By hand: a layer is q, o 2 x 1024^2 + k, v 2 x 1024 x 256 + MLP 3 x 1024 x 2048 + 2 norms x 1024
# = 8,914,944; 6 layers + embedding and head 2 x 4096 x 1024 + final norm 1024.
NUM_PARAMS = 61_879_296
MAX_SHARE = 0.5


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _meta_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**CONFIG))


def _memory_worker(rank: int, world_size: int, checkpoint: str, out: str) -> None:
    import torch.distributed as dist

    from wrappers import wrap

    env = launch_env(rank, world_size)
    model = _meta_model()
    dist.barrier()
    before_kib = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    model = wrap(model, mesh=ParallelDims(dp_shard=2, tp=2, world_size=4), checkpoint=checkpoint, env=env,
                 verbose=False)
    rise = (_kib("VmHWM") - before_kib) * 1024
    owned = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    found = [None] * world_size
    dist.all_gather_object(found, {"rise_bytes": rise, "owned_bytes": owned})
    if rank == 0:
        Path(out).write_text(json.dumps(found))


def _write_checkpoint(directory: Path) -> int:
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(p.shape, generator=generator) * 0.02 for name, p in _meta_model().named_parameters()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_meta_load_peak_host_memory_is_a_fraction_of_the_model(tmp_path):
    assert _write_checkpoint(tmp_path) == NUM_PARAMS
    model_bytes = NUM_PARAMS * 4
    out = tmp_path / "memory.json"
    run_distributed(_memory_worker, str(tmp_path), str(out), world_size=4, timeout_s=300)
    for rank, found in enumerate(json.loads(out.read_text())):
        assert found["owned_bytes"] < 0.26 * model_bytes, (rank, found)  # a quarter, plus replicated norms
        assert found["rise_bytes"] < MAX_SHARE * model_bytes, (rank, found["rise_bytes"] / model_bytes)
    print({rank: round(f["rise_bytes"] / model_bytes, 3) for rank, f in enumerate(json.loads(out.read_text()))})
