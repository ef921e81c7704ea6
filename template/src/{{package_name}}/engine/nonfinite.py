"""Non-finite losses and gradients, caught without making the host wait for the device.

Testing `loss.isfinite()` on the host every step would sync with the device every step. Here
each step folds its verdict into device tensors and skips a non-finite update on the device
itself; the host reads the verdict only at steps that log, and all ranks stop there together,
before a non-finite state could be checkpointed.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from . import dist


class Health:
    """The first step with a non-finite loss or gradient norm, noted on the device.

    check(), at a step that logs, agrees across ranks on the first bad step (one collective,
    one host read).
    """

    NONE = 2**62  # "no bad step yet"; larger than any step

    def __init__(self, device: torch.device, scaler_skips: bool) -> None:
        self.scaler_skips = scaler_skips  # fp16: an overflow is routine, the scaler skips it
        self.first_bad = torch.full((2,), self.NONE, dtype=torch.int64, device=device)
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.skipped = 0  # skipped_steps as of the last check

    def note(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Record optimizer step `step` (1-based): device operations only, no sync."""
        bad_grad = ~grad_norm.isfinite()
        self.skipped_steps += bad_grad
        bad = torch.stack([~loss.isfinite(), bad_grad & (not self.scaler_skips)])
        self.first_bad = torch.where(bad, self.first_bad.clamp(max=step), self.first_bad)

    def record(self) -> dict[str, int]:
        """For the metrics line (fp16): optimizer steps the scaler skipped, as of check()."""
        return {"skipped_steps": self.skipped} if self.scaler_skips else {}

    def check(self, now: int) -> str:
        """A collective and one host read: '' if all is well, else why all ranks stop."""
        agreed = dist.min_(torch.cat([self.first_bad, -self.skipped_steps.view(1)]))
        bad_loss, bad_grad, minus_skipped = agreed.tolist()
        self.skipped = -minus_skipped
        if bad_loss == bad_grad == self.NONE:
            return ""
        if bad_loss <= bad_grad:  # a NaN loss makes NaN gradients too: name the cause
            what = f"loss on some rank at step {bad_loss}"
        else:
            what = f"gradient norm at step {bad_grad}"
        return (
            f"non-finite {what}; its update was not applied, and all ranks stopped at step"
            f" {now}. Try a lower --lr, more --warmup-steps or --grad-clip, and rerun with"
            " --detect-anomaly to find the operation that produced it."
        )


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer takes a `found_inf` tensor (fused Adam, AdamW and SGD do): then
    a non-finite update is skipped on the device, without the host reading the gradient norm."""
    return getattr(optimizer, "_step_supports_amp_scaling", False)


@contextmanager
def found_inf(optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor) -> Iterator[None]:
    """During optimizer.step(): the device's verdict on the gradients, as GradScaler hands it to
    such an optimizer (1.0: leave parameters and moments alone)."""
    optimizer.found_inf = (~grad_norm.isfinite()).float()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


def note_host_reads(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    """Say once (rank 0) when step.update must sync with the device every step: an optimizer
    that takes no found_inf tensor, without fp16's scaler (which skips updates itself)."""
    if scaler.is_enabled() or skips_on_device(optimizer):
        return
    dist.print0(
        f"note: {type(optimizer).__name__} cannot skip a non-finite update on the device (it takes"
        " no found_inf, as fused Adam, AdamW and SGD do), so every step waits for the gradient"
        " norm on the host: a sync per step. Pass fused=True where the optimizer has it (fused"
        " SGD cannot update sharded DTensor weights)."
    )


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first tensor with a NaN or an infinity in it, if any: weights to start
    from are checked, or the first step's non-finite loss would be blamed on --lr. Shapes
    without values (a sharded checkpoint's, on the meta device) are not checked here."""
    real = ((name, t) for name, t in tensors.items() if t.is_floating_point() and not t.is_meta)
    return next((name for name, t in real if not t.isfinite().all()), None)
