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


def _tokens_per_sample(sample: object) -> int | None:
    """The last dimension of a sample's token ids: ``input_ids`` of a dict, else its first tensor."""
    if isinstance(sample, dict):
        sample = sample.get("input_ids", next(iter(sample.values()), None))
    elif isinstance(sample, (tuple, list)) and sample:
        sample = sample[0]
    shape = getattr(sample, "shape", None)
    return int(shape[-1]) if shape else None


def loader_shape(loader: DataLoader | None) -> tuple[int | None, int | None]:
    """(samples per batch on each rank, tokens per sample) the loader will feed: its ``batch_size`` (which a
    ``DistributedSampler`` keeps per rank), and the token count of the dataset's first sample (a map-style
    dataset's item 0; a collate function that pads further is not seen). None where the loader does not say."""
    if loader is None:
        return None, None
    seq_len = None
    dataset = getattr(loader, "dataset", None)
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        try:
            seq_len = _tokens_per_sample(dataset[0]) if len(dataset) else None
        except Exception:  # noqa: BLE001 - a dataset that cannot be indexed cheaply is read as "not said"
            seq_len = None
    return getattr(loader, "batch_size", None), seq_len
