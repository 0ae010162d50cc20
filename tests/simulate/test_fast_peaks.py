"""``advisor.simulate.measure.fast_peaks`` makes the same updates as torch's ``MemTracker._update_peak_stats``: every
module's local peak and peak snapshots and the global peak, compared entry by entry with an unpatched tracker over
the same steps. The cases are the ones that could tell a shortcut from torch's walk: checkpointed blocks (recomputed
in backward), one module called twice in a forward and shared by two blocks, the module stats reset between two
steps, a child called on its own before its parent names it, and two modules of one name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from advisor.simulate.measure import fast_peaks  # noqa: E402


class _Block(nn.Module):
    def __init__(self, shared: nn.Linear):
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), shared

    def forward(self, x):
        return self.b(self.b(torch.relu(self.a(x))) * 2)


class _Net(nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        shared = nn.Linear(32, 32)
        self.blocks = nn.ModuleList([_Block(shared), _Block(shared)])
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x.sum()


def _tracked(fast: bool, case: str):
    torch.manual_seed(0)
    net = _Net(checkpointed=case == "checkpointed")
    opt = torch.optim.AdamW(net.parameters())
    x = torch.randn(4, 32, requires_grad=True)
    tracker = MemTracker()
    if fast:
        assert fast_peaks(tracker) is tracker
    tracker.track_external(net, opt, x)
    with tracker:
        if case == "child first":
            net.blocks[0].a(x).sum()
        net(x).backward()
        opt.step()
        opt.zero_grad()
        if case in ("reset", "child first"):
            tracker.reset_mod_stats()
            net(x).backward()
            opt.step()
        if case == "one name twice":
            (nn.Linear(32, 32)(x) + nn.Linear(32, 32)(x)).sum().backward()
    modules = sorted((stats.mod_fqn, sorted(stats.local_peak.items()), repr(stats.snapshots))
                     for stats in tracker.memory_tracking.values())
    return modules, dict(tracker._peak_mem), repr(tracker._peak_mem_snap)


@pytest.mark.parametrize("case", ["plain", "checkpointed", "reset", "child first", "one name twice"])
def test_the_same_updates_as_torchs_walk(case):
    torchs, ours = _tracked(False, case), _tracked(True, case)
    assert ours[0] and ours == torchs


def test_a_tracker_without_torchs_attributes_is_left_alone():
    class Other:
        pass

    other = Other()
    assert fast_peaks(other) is other and not hasattr(other, "_update_peak_stats")
