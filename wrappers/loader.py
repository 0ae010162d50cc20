"""Shard a ``DataLoader`` across ranks with a ``DistributedSampler``, and handle ``set_epoch``.

The returned loader is a ``DataLoader`` whose ``__iter__`` calls ``sampler.set_epoch(n)`` with the
number of epochs started so far, so each epoch reshuffles differently on every rank without the
training loop calling ``set_epoch`` itself (calling it anyway is harmless: the next ``__iter__``
uses the count).
"""

from __future__ import annotations

import warnings

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler


class EpochDataLoader(DataLoader):
    """A ``DataLoader`` over a ``DistributedSampler`` that advances the sampler's epoch on each pass."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def __iter__(self):
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return super().__iter__()


def shard_loader(loader: DataLoader, *, num_replicas: int, rank: int) -> DataLoader:
    """The same loader, each rank reading its own 1/num_replicas of the dataset."""
    if isinstance(loader.sampler, DistributedSampler):
        return loader  # already sharded by the caller
    if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)) or loader.batch_size is None:
        warnings.warn("wrap(): the loader has a custom sampler or batch sampler; it is returned unsharded, "
                      "so every rank reads the whole dataset", stacklevel=3)
        return loader
    sampler = DistributedSampler(loader.dataset, num_replicas=num_replicas, rank=rank,
                                 shuffle=isinstance(loader.sampler, RandomSampler), drop_last=loader.drop_last)
    return EpochDataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
    )
