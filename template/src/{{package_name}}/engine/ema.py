"""--ema-decay D: an exponential moving average (EMA) of the weights, evaluated beside them.

After every optimizer step each floating-point weight and buffer of the average moves toward the
model's: ema = D x ema + (1 - D) x model (BatchNorm's running statistics too; its integer step
counter is copied), as timm's ModelEmaV3 does by default. The average starts as the model's
initial (or --init-from) weights, lives on the model's device and is updated there without a
sync; it is saved in every checkpoint ("ema"), so a resume continues it exactly, and evaluated
as eval_ema_* beside the model's eval_*. It depends only on the weights after each step, so it is
the same for any world size, worker count and resume as they are.
"""

import copy
from typing import Any

import torch
from torch import nn


class WeightAverage:
    """The EMA of `model`'s weights: a copy of the model that update() moves toward it."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).requires_grad_(False)
        # Pairs (the average's tensor, the model's) by name; a weight shared by two modules
        # (tied embeddings) appears once, so it is not moved twice a step.
        mine = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
        theirs = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        pairs = [(mine[name], theirs[name].detach()) for name in mine]
        self.averaged = [pair for pair in pairs if pair[0].is_floating_point()]
        self.copied = [pair for pair in pairs if not pair[0].is_floating_point()]
        self.lerped = tuple(zip(*self.averaged, strict=True))  # (averages, models), for update()

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average, after the optimizer's step: device work only."""
        if self.averaged:
            torch._foreach_lerp_(*self.lerped, 1 - self.decay)
        for ema, model in self.copied:
            ema.copy_(model)

    @torch.no_grad()
    def restart(self) -> None:
        """Start the average at the model's weights (--init-from loaded them)."""
        for ema, model in self.averaged + self.copied:
            ema.copy_(model)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)


def prefixed(record: dict[str, Any]) -> dict[str, Any]:
    """The average's evaluation under its own names: eval_loss -> eval_ema_loss."""
    return {"eval_ema_" + key.removeprefix("eval_"): value for key, value in record.items()}
