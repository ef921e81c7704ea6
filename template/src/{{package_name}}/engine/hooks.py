"""Task: everything the engine asks of a task, in one class that task.py subclasses. The engine
calls these methods and imports nothing of the task's; a method not overridden keeps the default
below. A batch is whatever the task's datasets return, moved to the device as it is (tensors in
tuples, lists and dicts).
"""

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from .config import RunConfig
from .files import Stop


class Task:
    """The task of a run with settings `cfg`: its data, model, loss, evaluation and metrics."""

    units = "samples"  # what the console's throughput counts: "12,345 samples/s"
    tokens_per_sample = 0  # > 0: tokens/s in the metrics, and MFU with flops_per_token()

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    # The data and the model. Every rank calls prepare() before the process group exists.
    def prepare(self, world_size: int, stop: Stop) -> None:
        """Check (or convert) the data; ConfigError (one line, exit 2) if it cannot be used."""

    def build_datasets(self) -> tuple[Dataset, Dataset]:
        """The training and validation datasets (map-style: __len__ and __getitem__)."""
        raise NotImplementedError

    def build_model(self, cfg: RunConfig) -> nn.Module:
        """The network for settings `cfg` (this run's, or a checkpoint's for a shape check)."""
        raise NotImplementedError

    # Training and evaluation.
    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        """The mean loss of a micro-batch, every sample weighing the same."""
        raise NotImplementedError

    def eval_sums(self, model: nn.Module, batch: Any) -> Tensor:
        """A float64 vector of sums over the batch, the loss's sum first and the number of
        predictions last; the engine adds them up over all batches and ranks."""
        raise NotImplementedError

    def eval_record(self, sums: list[float]) -> dict[str, Any]:
        """The metrics (eval_* keys) from the whole validation set's eval_sums."""
        return {"eval_loss": sums[0] / sums[-1]}

    def console(self, record: dict[str, Any]) -> list[str]:
        """The evaluation's part of a console line, for a record that has eval_loss."""
        return [f"eval {record['eval_loss']:.4g}"]

    def flops_per_token(self, model: nn.Module) -> float:
        """Training FLOPs per token, for MFU (0: unknown, no MFU column)."""
        return 0.0

    # Checkpoints.
    def checkpoint_extras(self) -> dict[str, Any]:
        """What every checkpoint keeps about this run's data (plain types)."""
        return {}

    def check_checkpoint(self, state: dict[str, Any], path: Path, resuming: bool) -> set[str]:
        """The checkpoint at `path` fits this run's data (checkpoint_extras then and now), for
        --resume (resuming) or --init-from, or ConfigError; returns the settings that may differ
        because their content was checked (the data's paths, say)."""
        return set()

    def init_weights(self, spec: str, device: torch.device) -> dict[str, Tensor] | None:
        """--init-from SPEC that is no checkpoint (lm: hf:NAME): its weights; None otherwise."""
        return None
