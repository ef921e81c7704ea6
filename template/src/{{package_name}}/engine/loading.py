"""How each rank reads its share of a dataset, for every task: training in whole global
batches that can start part way through an epoch (exact resume), evaluation in unpadded shards.
A dataset may return a whole micro-batch from `__getitems__(indices)` as a Batch: one gather
instead of B small reads and a collate, which made the loader, not the GPU, the bottleneck."""

import math
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, default_collate

from .config import RunConfig, global_batch
from .dist import DistEnv
from .options import ConfigError
from .workers import Loader, SharedEpoch

if TYPE_CHECKING:
    from .state import Progress


class Batch(tuple):
    """Tensors that are already a batch: `collate` passes them through."""


class DataError(Exception):
    """A sample that cannot be read, raised by a dataset with a message that names it: the run
    stops with that one line (exit 1), from a loader worker too."""

    def __str__(self) -> str:
        text = super().__str__()  # from a worker: "Caught DataError in ...", its traceback, ours
        return text.rstrip().splitlines()[-1].split(": ", 1)[-1] if "\n" in text else text


def worker_lost(err: BaseException) -> BaseException:
    """`err`, or one line (DataError) if it says that a loader worker died: killed by a signal
    (the OOM killer, mostly), torch raises it wherever the main process then is."""
    if not (isinstance(err, RuntimeError) and str(err).startswith("DataLoader worker (pid")):
        return err
    why = str(err.__cause__ or err).strip()  # "DataLoader worker (pid 7) is killed by signal: ..."
    return DataError(
        f"{why.rstrip('.')}. If the kernel's OOM killer stopped it (dmesg says so), this machine"
        " ran out of memory: fewer --num-workers, a smaller --batch-size, or more memory"
    )


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

    def places(self, micro: int, batch_size: int) -> range:
        """Where this rank's samples of micro-batch `micro` stand in their step's global batch,
        which keys their random draws (keyed.py): rank r takes every W-th position from r, so
        sample j of micro-batch m is at (m B + j) W + r, on any world size and split."""
        W, r, B = self.num_replicas, self.rank, batch_size
        return range(micro * B * W + r, (micro + 1) * B * W + r, W)

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start // self.num_replicas :])

    def __len__(self) -> int:
        return self.num_samples - self.start // self.num_replicas


def build_train_loader(
    dataset: Dataset, cfg: RunConfig, env: DistEnv, device: torch.device
) -> tuple[DataLoader, ResumableSampler]:
    """Per-rank loader of micro-batches of --batch-size samples, whole global batches per epoch."""
    if hasattr(dataset, "set_epoch") and not getattr(dataset, "shares_epoch", False):
        dataset = SharedEpoch(dataset)
    sampler = ResumableSampler(dataset, env, cfg.seed, global_batch(cfg, env.world_size))
    return _loader(dataset, cfg, device, sampler=sampler), sampler


def build_windows(
    dataset: Dataset, cfg: RunConfig, env: DistEnv, device: torch.device
) -> "Windows":
    """The training set's optimizer steps, as windows of micro-batches (Windows)."""
    loader, sampler = build_train_loader(dataset, cfg, env, device)
    return Windows(loader, sampler, cfg.grad_accum_steps)


def check_global_batch(
    samples: int, cfg: RunConfig, world_size: int, what: str = "", fix: str = ""
) -> None:
    """An epoch reads whole global batches: fewer training samples are a one-line ConfigError.
    `what` names them and `fix` says what to do, in the data's own terms (a task's prepare)."""
    size = global_batch(cfg, world_size)
    if samples < size:
        what = what or f"the training set's {samples} samples are"
        raise ConfigError(
            f"{what} less than one global batch (--batch-size x --grad-accum-steps x world size"
            f" = {size}); {fix or 'use more data or a smaller batch'}"
        )


def copies(sample: Any, count: int, device: torch.device) -> Any:
    """A batch of `count` copies of one sample (0: an empty batch of its shapes), on `device`,
    for the checks and set-up that run the model before training (task.loss takes it)."""
    batch = map_batch(collate([sample] * max(count, 1)), lambda tensor: tensor[:count])
    return to_device(batch, device)


def eval_shard(num_samples: int, env: DistEnv) -> range:
    """Indices this rank evaluates: disjoint, covering, unpadded (padding would count twice)."""
    return range(env.rank, num_samples, env.world_size)


def build_eval_loader(
    dataset: Dataset, cfg: RunConfig, env: DistEnv, device: torch.device
) -> DataLoader:
    """A loader of this rank's shard of the validation set (its first --eval-batches), in order."""
    if cfg.eval_batches:  # the same samples on any world size
        size = cfg.eval_batches * global_batch(cfg, env.world_size)
        dataset = Subset(dataset, range(min(size, len(dataset))))
    shard = Subset(dataset, eval_shard(len(dataset), env))  # Subset forwards __getitems__
    return _loader(shard, cfg, device)


def _loader(dataset: Dataset, cfg: RunConfig, device: torch.device, **kwargs: Any) -> DataLoader:
    workers = num_workers(cfg)
    return Loader(
        dataset,
        batch_size=cfg.batch_size,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=device.type == "cuda",  # page-locked memory: async host-to-GPU copies
        # Workers start once for every epoch and evaluation (workers.py says why).
        # The loader's own RNG keeps iter(loader) off the global one (dropout's).
        persistent_workers=workers > 0,
        prefetch_factor=prefetch_factor(cfg, workers) if workers else None,
        generator=torch.Generator().manual_seed(cfg.seed),
        **kwargs,
    )


MAX_WORKERS = 8  # per rank, for --num-workers -1; more rarely helps, each holds a prefetch


def num_workers(cfg: RunConfig) -> int:
    """--num-workers, or for -1 (auto) this node's CPUs shared by its ranks, one left for the
    rank itself, at most MAX_WORKERS."""
    if cfg.num_workers >= 0:
        return cfg.num_workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_rank = (cpus or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(0, min(MAX_WORKERS, per_rank - 1))


def prefetch_factor(cfg: RunConfig, workers: int) -> int:
    """--prefetch-factor, or (0: auto) enough for two optimizer steps over all workers."""
    return cfg.prefetch_factor or max(2, math.ceil(2 * cfg.grad_accum_steps / workers))


class Micro(NamedTuple):
    """A micro-batch as the dataset gave it, and its samples' places (ResumableSampler.places)."""

    batch: Any
    places: range


class Windows:
    """The micro-batches of each optimizer step, epoch after epoch, from where the run stands:
    --grad-accum-steps on every rank, one whole global batch (ResumableSampler)."""

    def __init__(self, loader: DataLoader, sampler: ResumableSampler, accum: int) -> None:
        self.loader, self.sampler, self.accum = loader, sampler, accum
        self.global_batch = sampler.global_batch  # samples per step, over all ranks
        self.batches: Iterator[Any] = iter([])
        self.remaining = 0  # micro-batches left in this epoch
        self.epoch_done = False  # the last window returned ends its epoch

    def next(self, progress: "Progress") -> "Window":
        """The next optimizer step's micro-batches."""
        if self.remaining == 0:  # start an epoch, or continue a resumed one where it stopped
            self.sampler.set_position(progress.epoch, progress.position)
            self.batches, self.remaining = iter(self.loader), len(self.loader)
        self.remaining -= self.accum
        self.epoch_done = self.remaining == 0
        return Window(self.batches, self.sampler, self.loader.batch_size or 1, self.accum)


class Window:
    """One optimizer step's micro-batches, read from the loader as they are asked for."""

    def __init__(
        self, batches: Iterator[Any], sampler: ResumableSampler, batch_size: int, count: int
    ) -> None:
        self.batches, self.sampler = batches, sampler
        self.batch_size, self.count = batch_size, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Micro]:
        for micro in range(self.count):
            yield Micro(next(self.batches), self.sampler.places(micro, self.batch_size))


def to_device(batch: Any, device: torch.device) -> Any:
    """The batch with its tensors on `device` (from pinned memory, the copy does not wait)."""
    return map_batch(batch, lambda tensor: tensor.to(device, non_blocking=True))


def map_batch(batch: Any, f: Callable[[torch.Tensor], Any]) -> Any:
    """The batch with `f` applied to its tensors, in tuples, lists and dicts as they were."""
    if isinstance(batch, torch.Tensor):
        return f(batch)
    if isinstance(batch, dict):
        return {key: map_batch(value, f) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_batch(value, f) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(map_batch(value, f) for value in batch)
    return batch
