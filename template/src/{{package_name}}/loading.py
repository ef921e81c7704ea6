"""How each rank reads its share of a dataset: the same for every task.

Training: ResumableSampler deals each epoch's shuffled samples out to the ranks (disjoint
shards, no padding) in whole global batches, and can start part way through an epoch, which
exact resume needs.
Evaluation: every rank reads an unpadded shard in order (eval_shard), so no sample is counted
twice. A dataset may return a whole micro-batch at once from `__getitems__(indices)` as a
Batch: one gather instead of B per-sample reads and a collate of B small tensors, which made
the data loader, not the GPU, the bottleneck.
"""

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, default_collate

from .config import TrainConfig
from .dist import DistEnv


class Batch(tuple):
    """Tensors that are already a batch: `collate` passes them through."""


def collate(samples: Any) -> Any:
    """Batches made by `__getitems__` pass through; lists of samples are stacked as usual."""
    return tuple(samples) if isinstance(samples, Batch) else default_collate(samples)


class ResumableSampler(DistributedSampler):
    """DistributedSampler that reads whole global batches and can start part way through.

    Each epoch is a permutation seeded by (seed, epoch), cut to a multiple of the global batch
    (--batch-size x --grad-accum-steps x world size): every optimizer step averages exactly one
    global batch, and the samples left over (fewer than one global batch, a different set each
    epoch) are not read, as DataLoader's drop_last does on one GPU. Rank r reads positions
    r, r+W, r+2W, ... of the cut permutation, so optimizer step k of an epoch reads positions
    [k G, (k+1) G) whatever the world size W and the split of the global batch G into
    --batch-size and --grad-accum-steps: runs that differ only in that split compute the same
    updates, and a run can resume on another world size exactly. `start` counts the positions
    (summed over ranks) to skip when resuming in the middle of an epoch.
    """

    def __init__(self, dataset: Dataset, env: DistEnv, seed: int, global_batch: int) -> None:
        super().__init__(dataset, env.world_size, env.rank, shuffle=True, seed=seed, drop_last=True)
        self.total_size = len(dataset) // global_batch * global_batch  # whole global batches
        self.num_samples = self.total_size // self.num_replicas
        self.global_batch, self.start = global_batch, 0

    def set_position(self, epoch: int, start: int) -> None:
        """Read epoch `epoch` (a new shuffle each epoch), skipping its first `start` samples."""
        assert start % self.global_batch == 0, "resume positions are whole global batches"
        self.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start // self.num_replicas :])

    def __len__(self) -> int:
        return self.num_samples - self.start // self.num_replicas


def build_train_loader(
    dataset: Dataset, cfg: TrainConfig, env: DistEnv, device: torch.device
) -> tuple[DataLoader, ResumableSampler]:
    """Per-rank loader of micro-batches of --batch-size samples, whole global batches per epoch."""
    global_batch = cfg.batch_size * cfg.grad_accum_steps * env.world_size
    sampler = ResumableSampler(dataset, env, seed=cfg.seed, global_batch=global_batch)
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",  # page-locked memory: async host-to-GPU copies
        persistent_workers=cfg.num_workers > 0,  # keep workers alive between epochs
        generator=_private_generator(cfg.seed),
    )
    return loader, sampler


def _private_generator(seed: int) -> torch.Generator:
    """The loader's own RNG. Without one, every iter(loader) draws its workers' base seed from
    torch's global RNG, which the model's random draws (dropout) use too: a resumed run, which
    starts its iterator at another step, would then draw other dropout masks."""
    return torch.Generator().manual_seed(seed)


def eval_shard(num_samples: int, env: DistEnv) -> range:
    """Indices this rank evaluates: disjoint, covering, and unpadded.

    DistributedSampler would pad the last round with duplicates so that all ranks get the same
    count; those duplicates would be counted twice in the metrics.
    """
    return range(env.rank, num_samples, env.world_size)


def build_eval_loader(
    dataset: Dataset, cfg: TrainConfig, env: DistEnv, device: torch.device
) -> DataLoader:
    """Per-rank loader over this rank's shard of the validation set, in order.

    Its worker processes (--num-workers) start once and serve every evaluation: starting them
    anew each time cost more than the evaluation itself on a GPU.
    """
    return DataLoader(
        Subset(dataset, eval_shard(len(dataset), env)),  # Subset forwards __getitems__
        batch_size=cfg.batch_size,
        collate_fn=collate,
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=cfg.num_workers > 0,
        generator=_private_generator(cfg.seed),
    )
