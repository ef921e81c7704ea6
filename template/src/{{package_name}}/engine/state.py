"""What training changes, and so what an exact resume restores: TrainState.

A new piece of state (a second optimizer, say) is a field of TrainState, one line in each of
state_dict() and load_state_dict(), and its name in KEYS: checkpoints and resume follow, and a
checkpoint from before it is refused with one line (resume.py). A piece that a setting turns on
(the EMA of the weights: --ema-decay, which a resume may not change) is in OPTIONAL instead.
"""

import random
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from . import dist, optim, parallel
from .config import RunConfig
from .ema import WeightAverage


@dataclass
class Start:
    """Where a run starts (resume.find_start): a checkpoint, weights, or from scratch."""

    resume: dict[str, Any] | None = None  # a checkpoint to continue exactly (--resume)
    weights: dict[str, torch.Tensor] | None = None  # a new run from these weights (--init-from)


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch being read (the sampler's shuffle seed is seed + epoch)
    position: int = 0  # samples of this epoch already consumed, summed over ranks

    def advance(self, samples: int, end_of_epoch: bool) -> None:
        """Count one optimizer step that consumed `samples` (summed over ranks)."""
        self.step += 1
        self.position += samples
        if end_of_epoch:
            self.epoch, self.position = self.epoch + 1, 0


@dataclass
class TrainState:
    """The model as it trains (wrapped by parallel.wrap), its optimizer, schedule, loss scaler,
    the data position, and the average of its weights (--ema-decay, or None)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    progress: Progress = field(default_factory=Progress)
    ema: WeightAverage | None = None

    # The entries of every checkpoint: resume.py refuses a file that lacks one before the process
    # group exists. A new entry of state_dict() goes here too (tests/test_checkpoint.py checks).
    KEYS = ("model", "optimizer", "scheduler", "scaler", "step", "epoch", "position", "rng")
    KEYS += ("world_size",)
    OPTIONAL = {"ema": "ema_decay"}  # entry: the setting that puts it in (resume.py requires it)

    def state_dict(self) -> dict[str, Any]:
        """Plain types and tensors, every rank's RNG state included. A collective."""
        rng = dist.all_gather_object(_rng_state(_device_of(self.model)))
        return {
            **parallel.model_state(self.model, self.optimizer),  # model and optimizer
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            **asdict(self.progress),
            "rng": rng,
            "world_size": len(rng),
            **({"ema": self.ema.state_dict()} if self.ema is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint that resume.py checked. Per-rank RNG states only come
        back at the world size they were saved at (at another, a warning)."""
        parallel.load_model_state(self.model, self.optimizer, state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(state["step"], state["epoch"], state["position"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        rank, world_size = dist.rank(), dist.world_size()
        if state["world_size"] == world_size:
            _set_rng_state(state["rng"][rank], _device_of(self.model))
        else:
            dist.print0(
                f"the checkpoint has {state['world_size']} ranks, this run {world_size}, with the"
                " same global batch: the run continues as the uninterrupted one up to float"
                " rounding (sums in another order); the per-rank RNG states are not restored,"
                " which changes only random draws that keyed.py does not make"
            )

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """--init-from: the model's weights only; optimizer, schedule and progress stay fresh."""
        parallel.load_weights(self.model, weights)
        if self.ema is not None:  # the average starts at the loaded weights
            self.ema.restart()


def restore(start: Start, state: TrainState, cfg: RunConfig) -> None:
    """Load where the run starts (resume.find_start) into a freshly built state."""
    if start.weights is not None:  # --init-from: the weights only; step 0, all else fresh
        state.load_weights(start.weights)
    if start.resume is not None:
        state.load_state_dict(start.resume)
        optim.reschedule(state.optimizer, state.scheduler, cfg)  # --max-steps may have changed


def _device_of(model: nn.Module) -> torch.device:
    """Where the model trains (its parameters' device)."""
    return next(model.parameters()).device


def _rng_state(device: torch.device) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def _set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"].cpu())  # map_location moved it; RNG states live on CPU
    if rng["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)
