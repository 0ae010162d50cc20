"""``wrap()`` refuses a model that is already wrapped (issue 21, item 10): ``wrap(wrap(m))`` gave
DDP(DDP(m)) and a user's own DDP model got FSDP2 on top, with the post-wrap check passing. One process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tests.wrappers._dist import tiny_llama
from torch.nn.parallel import DistributedDataParallel

from wrappers import wrap
from wrappers.launch_env import read_launch_env

ONE = read_launch_env({})


def test_wrapping_the_result_of_wrap_is_refused():
    model = wrap(tiny_llama(0), env=ONE, verbose=False)
    with pytest.raises(ValueError, match="wrapped by wrap\\(\\) already"):
        wrap(model, env=ONE, verbose=False)


def test_a_users_ddp_model_is_refused(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(tiny_llama(0))
        with pytest.raises(ValueError, match="DistributedDataParallel: pass model.module"):
            wrap(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), env=ONE, verbose=False)
    finally:
        dist.destroy_process_group()
