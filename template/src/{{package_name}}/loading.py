"""How each rank reads its share of a dataset, for every task: training in whole global
batches that can start part way through an epoch (exact resume), evaluation in unpadded shards.
A dataset may return a whole micro-batch from `__getitems__(indices)` as a Batch: one gather
instead of B small reads and a collate, which made the loader, not the GPU, the bottleneck.
"""

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, default_collate

from .config import TrainConfig, global_batch
from .dist import DistEnv
from .state import Progress


class Batch(tuple):
    """Tensors that are already a batch: `collate` passes them through."""


def collate(samples: Any) -> Any:
    """Batches made by `__getitems__` pass through; lists of samples are stacked as usual."""
    return tuple(samples) if isinstance(samples, Batch) else default_collate(samples)


class ResumableSampler(DistributedSampler):
    """DistributedSampler that reads whole global batches and can start part way through.

    Each epoch is a permutation seeded by (seed, epoch), cut to a multiple of the global batch G
    (the rest is not read, as with drop_last). Rank r of W reads positions r, r+W, ..., so step
    k of an epoch reads positions [k G, (k+1) G) whatever W and the split of G into --batch-size
    and --grad-accum-steps: such runs compute the same updates, and resume exactly on another
    world size. `start`: the positions (summed over ranks) to skip when resuming mid-epoch.
    A dataset with a `set_epoch(epoch)` method is told each epoch, as the sampler is.
    """

    def __init__(self, dataset: Dataset, env: DistEnv, seed: int, global_batch: int) -> None:
        super().__init__(dataset, env.world_size, env.rank, shuffle=True, seed=seed, drop_last=True)
        if len(dataset) < global_batch:
            raise ValueError(f"{len(dataset)} training samples are less than one global batch")
        self.total_size = len(dataset) // global_batch * global_batch  # whole global batches
        self.num_samples = self.total_size // self.num_replicas
        self.global_batch, self.start = global_batch, 0

    def set_position(self, epoch: int, start: int) -> None:
        """Read epoch `epoch` (a new shuffle each epoch), skipping its first `start` samples."""
        assert start % self.global_batch == 0, "resume positions are whole global batches"
        self.set_epoch(epoch)
        if hasattr(self.dataset, "set_epoch"):  # a dataset that augments (keyed.generator)
            self.dataset.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start // self.num_replicas :])

    def __len__(self) -> int:
        return self.num_samples - self.start // self.num_replicas


def build_train_loader(
    dataset: Dataset, cfg: TrainConfig, env: DistEnv, device: torch.device
) -> tuple[DataLoader, ResumableSampler]:
    """Per-rank loader of micro-batches of --batch-size samples, whole global batches per epoch."""
    size = global_batch(cfg, env.world_size)
    sampler = ResumableSampler(dataset, env, seed=cfg.seed, global_batch=size)
    return _loader(dataset, cfg, device, sampler=sampler), sampler


def eval_shard(num_samples: int, env: DistEnv) -> range:
    """Indices this rank evaluates: disjoint, covering, and unpadded (DistributedSampler pads
    with duplicates, which the metrics would count twice)."""
    return range(env.rank, num_samples, env.world_size)


def build_eval_loader(
    dataset: Dataset, cfg: TrainConfig, env: DistEnv, device: torch.device
) -> DataLoader:
    """Per-rank loader over this rank's shard of the validation set, in order."""
    shard = Subset(dataset, eval_shard(len(dataset), env))  # Subset forwards __getitems__
    return _loader(shard, cfg, device)


def _loader(dataset: Dataset, cfg: TrainConfig, device: torch.device, **kwargs: Any) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        collate_fn=collate,
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",  # page-locked memory: async host-to-GPU copies
        # Workers start once and serve every epoch and evaluation (anew, they cost more than an
        # evaluation); but a worker's copy of the dataset is made when it starts, so with a
        # dataset that must learn each epoch (set_epoch) they start anew every epoch. The
        # loader's own RNG: without it, iter(loader) draws its workers' seed from the global
        # RNG, which dropout uses too, and a resumed run would draw other masks.
        persistent_workers=cfg.num_workers > 0 and not hasattr(dataset, "set_epoch"),
        generator=torch.Generator().manual_seed(cfg.seed),
        **kwargs,
    )


class Windows:
    """The micro-batches of each optimizer step, epoch after epoch, from where the run stands.

    A window is --grad-accum-steps micro-batches on every rank: one global batch. The sampler
    deals out whole global batches only (ResumableSampler), so every window is full.
    """

    def __init__(self, loader: DataLoader, sampler: ResumableSampler, accum: int) -> None:
        self.loader, self.sampler, self.accum = loader, sampler, accum
        self.batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter([])
        self.remaining = 0  # micro-batches left in this epoch
        self.epoch_done = False  # the last window returned ends its epoch

    def next(self, progress: Progress) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.remaining == 0:  # start an epoch, or continue a resumed one where it stopped
            self.sampler.set_position(progress.epoch, progress.position)
            self.batches, self.remaining = iter(self.loader), len(self.loader)
        self.remaining -= self.accum
        self.epoch_done = self.remaining == 0
        return self.batches
