"""The synthetic classification task, and how each rank reads its share of it.

To train on your own data, replace `build_datasets` with one returning your training and
validation datasets (anything with __len__ and __getitem__ giving (input, label)); the sampling
below works for any map-style dataset. Data held in memory reads a whole micro-batch with one
indexing operation per tensor (InMemoryDataset): per-sample __getitem__ calls and a collate of
B small tensors made the data loader, not the GPU, the bottleneck.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    Subset,
    TensorDataset,
    default_collate,
)

from .config import TrainConfig
from .dist import DistEnv


def build_datasets(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """Inputs from a normal distribution, labels from a fixed random 'teacher' network.

    Everything comes from --seed through private generators, so every rank builds the same
    data whatever the world size, and changing --num-samples does not change the teacher.
    """
    teacher = torch.Generator().manual_seed(cfg.seed)
    w1 = torch.randn(cfg.input_dim, 64, generator=teacher) / cfg.input_dim**0.5
    w2 = torch.randn(64, cfg.num_classes, generator=teacher) / 8.0

    def make(num: int, seed: int) -> InMemoryDataset:
        inputs = torch.randn(num, cfg.input_dim, generator=torch.Generator().manual_seed(seed))
        labels = (torch.tanh(inputs @ w1) @ w2).argmax(dim=1)
        return InMemoryDataset(inputs, labels)

    return make(cfg.num_samples, cfg.seed + 1), make(cfg.val_samples, cfg.seed + 2)


class Batch(tuple):
    """Tensors that are already a batch: `collate` passes them through."""


class InMemoryDataset(TensorDataset):
    """A TensorDataset that gathers a whole batch at once.

    DataLoader calls `__getitems__(indices)` (when a dataset has it) instead of one __getitem__
    per sample; indexing each tensor with the batch's indices is one copy, and the result is
    bitwise the rows that per-sample reads would have stacked.
    """

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = torch.as_tensor(indices, dtype=torch.long)
        return Batch(tensor[index] for tensor in self.tensors)


def collate(samples: Any) -> Any:
    """Batches made by `__getitems__` pass through; lists of samples are stacked as usual."""
    return tuple(samples) if isinstance(samples, Batch) else default_collate(samples)


class ResumableSampler(DistributedSampler):
    """DistributedSampler that never pads and can start an epoch part way through.

    Each epoch is a permutation seeded by (seed, epoch), cut to a multiple of the world size
    (drop_last=True: no duplicated samples), and rank r reads positions r, r+W, r+2W, ...
    So the first m samples of every rank are exactly the first m*W positions of the
    permutation, whatever W is. `start` counts those positions (summed over ranks) to skip
    when resuming in the middle of an epoch.
    """

    def __init__(self, dataset: Dataset, env: DistEnv, seed: int) -> None:
        super().__init__(dataset, env.world_size, env.rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        """Read epoch `epoch` (a new shuffle each epoch), skipping its first `start` samples."""
        assert start % self.num_replicas == 0, "resume positions are whole micro-batches"
        self.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start // self.num_replicas :])

    def __len__(self) -> int:
        return self.num_samples - self.start // self.num_replicas


def build_train_loader(
    dataset: Dataset, cfg: TrainConfig, env: DistEnv, device: torch.device
) -> tuple[DataLoader, ResumableSampler]:
    """Per-rank loader of full micro-batches of --batch-size samples."""
    sampler = ResumableSampler(dataset, env, seed=cfg.seed)
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        drop_last=True,  # every micro-batch has B samples, so all ranks weigh samples equally
        collate_fn=collate,
        num_workers=cfg.num_workers,
        pin_memory=device.type == "cuda",  # page-locked memory: async host-to-GPU copies
        persistent_workers=cfg.num_workers > 0,  # keep workers alive between epochs
    )
    return loader, sampler


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
    )
