"""One optimizer step: micro-batches with no_sync, mixed precision, the update; and evaluation.

forward_backward() is where data parallelism shows: each micro-batch's backward accumulates
gradients locally, and only the last one of the step lets DDP all-reduce them (no_sync). The
loss is divided by the number of micro-batches, so the gradient is the mean over the global
batch whatever its split into ranks, micro-batches and --batch-size.
"""

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from . import dist, metrics, nonfinite, strategy
from .config import TrainConfig
from .state import TrainState

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepResult:
    loss: torch.Tensor  # mean micro-batch loss on this rank (on the device: no sync)
    grad_norm: torch.Tensor  # global gradient norm before clipping (on the device)
    lr: float  # learning rate this step used
    data_wait: float  # seconds this rank waited for batches
    started: float  # time.perf_counter() when the step began


def train_step(
    model: nn.Module,
    state: TrainState,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    cfg: TrainConfig,
    health: nonfinite.Health,
) -> StepResult:
    """The next optimizer step, over --grad-accum-steps micro-batches. No sync with the device.

    `model` is state.model, or its compiled form (--compile). All ranks must take the same
    decisions (update, skip, stop) at the same step, or one would wait forever in a collective
    the others never join. After the all-reduce every rank holds bitwise the same gradients,
    hence the same gradient norm, and skips the same non-finite update (nonfinite.py).
    """
    started, optimizer, scaler = time.perf_counter(), state.optimizer, state.scaler
    loss, data_wait = forward_backward(
        model,
        batches,
        cfg.grad_accum_steps,
        cfg.precision,
        scaler,
        state.strategy,
        masks=(cfg.seed, state.progress.step),
    )
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    grad_norm = state.strategy.clip_grad_norm(model, cfg.grad_clip or math.inf)
    health.note(state.progress.step + 1, loss, grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    nonfinite.apply_update(optimizer, scaler, grad_norm)
    state.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss, grad_norm, lr, data_wait, started)


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """Mixed precision for bf16/fp16, a no-op for fp32: one code path for all three."""
    return torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32")


def forward_backward(
    model: nn.Module,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    num_micro: int,
    precision: str,
    scaler: torch.amp.GradScaler,
    parallel: strategy.DDPStrategy,
    masks: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, float]:
    """Accumulate the gradient of one window of micro-batches; all-reduce it once.

    The gradient becomes the mean over all samples of the window on all ranks. Returns this
    rank's mean micro-batch loss (a device tensor: no sync) and seconds spent waiting for data.
    masks: (seed, step) to seed the model's random draws (dropout) with, per micro-batch.
    """
    device = next(model.parameters()).device
    loss_sum, data_wait = torch.zeros((), device=device), 0.0
    for micro in range(num_micro):
        waiting = time.perf_counter()
        inputs, labels = next(batches)
        data_wait += time.perf_counter() - waiting
        inputs = inputs.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        # Only the window's last backward all-reduces; the others accumulate locally.
        sync = micro == num_micro - 1
        if masks is not None:
            # Dropout masks from the micro-batch's place in the global batch (the sampler deals
            # it out rank by rank), not from the rank that holds it: at --batch-size 1, N ranks
            # draw the masks one process draws. hash() of ints is the same in every process.
            torch.manual_seed(hash((*masks, micro * dist.world_size() + dist.rank())))
        with parallel.no_sync(model, sync):
            with autocast(precision, device):
                loss = loss_fn(model(inputs), labels)
            # Divide by the window's length, so the gradient is a mean over its samples.
            scaler.scale(loss / num_micro).backward()
        loss_sum += loss.detach()
    return loss_sum / num_micro, data_wait


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction in the batch.

    logits (..., classes) and targets (...): one prediction per sample, or one per position
    of each sample's sequence; all of them weigh the same.
    """
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    precision: str,
    device: torch.device,
    parallel: strategy.DDPStrategy,
) -> dict[str, float]:
    """Exact validation loss and accuracy, computed by all ranks together.

    Every rank runs the unwrapped model (no DDP collectives) on its own unpadded shard, then
    one all-reduce adds up the loss sums, correct counts and prediction counts.
    """
    model = parallel.unwrap(model)
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    parallel.before_evaluate(model, loader, device)
    for inputs, labels in loader:
        inputs = inputs.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True).flatten()
        with autocast(precision, device):
            logits = model(inputs).flatten(0, -2)
        totals[0] += F.cross_entropy(logits.double(), labels, reduction="sum")
        totals[1] += (logits.argmax(dim=-1) == labels).sum()
        totals[2] += labels.numel()
    model.train()
    loss_sum, correct, count = dist.sum_(totals).tolist()
    return metrics.eval_record(loss_sum / count, correct / count)
