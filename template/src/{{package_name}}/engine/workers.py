"""How a loader's worker processes start: once, and without the trainer's garbage.

A worker is a fork of its rank, threads and all: of the trainer's state only what it needs is
safe there. Forked anew each epoch, from a process whose threads (a pending collective, a
checkpoint's writer, a lock's heartbeat) may hold an interpreter lock at that instant, a worker
can hang for good; so workers start once (SharedEpoch tells them each epoch). And a worker that
collects garbage it inherited, say a DDP model of an earlier run in the same process, destroys
that model's process group there, whose threads do not exist in it: it hangs too (Loader).
"""

import gc
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class Loader(DataLoader):
    """A DataLoader whose workers never collect what they inherit: it is frozen while they fork."""

    def __iter__(self) -> Any:
        if self.num_workers == 0:
            return super().__iter__()
        gc.freeze()  # inherited objects go to the permanent generation: no worker collects them
        try:
            return super().__iter__()
        finally:
            gc.unfreeze()  # this process collects them again


class SharedEpoch(Dataset):
    """A dataset whose set_epoch (the epoch of its keyed.generator draws) reaches its loader's
    workers through shared memory, so that they start once, not anew each epoch."""

    shares_epoch = True

    def __init__(self, dataset: Dataset) -> None:
        self.dataset, self.told = dataset, -1  # the epoch this process's copy was told
        self.epoch = torch.full((), -1, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self.epoch.fill_(epoch)
        self._tell()

    def _tell(self) -> None:
        if int(self.epoch) != self.told:
            self.told = int(self.epoch)
            self.dataset.set_epoch(self.told)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self._tell()
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        self._tell()
        getitems = getattr(self.dataset, "__getitems__", None)
        return getitems(indices) if getitems else [self.dataset[i] for i in indices]
