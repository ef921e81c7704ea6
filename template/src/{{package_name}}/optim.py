"""The optimizer and the learning-rate schedule."""

import math

import torch
from torch import nn

from .config import TrainConfig


def build_optimizer(
    cfg: TrainConfig, model: nn.Module, world_size: int, device: torch.device
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (no weight decay on biases) with linear warmup, then cosine decay."""
    peak_lr = cfg.lr
    if cfg.scale_lr:
        # Linear scaling rule (Goyal et al., 2017): a k times larger batch averages away more
        # gradient noise, so it can take k times larger steps. Pair it with warmup.
        peak_lr *= cfg.batch_size * cfg.grad_accum_steps * world_size / cfg.base_batch_size
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # fused: one kernel for the whole update where torch has one (CUDA and CPU); it was 1.04-1.09x
    # faster per step than the default on CPU in bench/ (same update up to float rounding).
    optimizer = torch.optim.AdamW(groups, lr=peak_lr, fused=device.type in ("cuda", "cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, scheduler


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based) as a fraction of the peak."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    done = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))
