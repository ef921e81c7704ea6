"""The optimizer and the learning-rate schedule."""

import math
from dataclasses import replace

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from .config import RunConfig, global_batch


def build_optimizer(
    cfg: RunConfig, model: nn.Module, world_size: int, device: torch.device
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW or SGD (no weight decay on biases) with linear warmup, then cosine decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # fused: one kernel for the whole update (CUDA and CPU), a few percent faster per step; it
    # takes a found_inf tensor, so a non-finite update is skipped without asking the host.
    fused = device.type in ("cuda", "cpu")
    lr = peak_lr(cfg, world_size)
    if cfg.optimizer == "sgd":  # fused SGD takes found_inf too, but not sharded DTensor weights
        sharded = any(isinstance(p, DTensor) for p in params)
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            groups, lr=lr, momentum=cfg.momentum, fused=fused and not sharded
        )
    else:
        betas = (cfg.beta1, cfg.beta2)
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, scheduler


def peak_lr(cfg: RunConfig, world_size: int) -> float:
    """--lr, or with --scale-lr the linear scaling rule's multiple of it."""
    if not cfg.scale_lr:
        return cfg.lr
    # Linear scaling rule (Goyal et al., 2017): a k times larger batch averages away more
    # gradient noise, so it can take k times larger steps. Pair it with warmup.
    return cfg.lr * global_batch(cfg, world_size) / cfg.base_batch_size


def lr_factor(step: int, cfg: RunConfig) -> float:
    """Learning rate of optimizer step `step` (0-based) as a fraction of the peak."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    # The cosine ends at --lr-decay-steps (or --max-steps) and stays at its floor after it. The
    # floor is --min-lr in units of --lr (so --scale-lr scales it too), or --min-lr-ratio.
    end = cfg.lr_decay_steps or cfg.max_steps
    floor = cfg.min_lr / cfg.lr if cfg.min_lr else cfg.min_lr_ratio
    done = min(1.0, (step - cfg.warmup_steps) / max(1, end - cfg.warmup_steps))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))


def reschedule(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    cfg: RunConfig,
) -> None:
    """After a resume: the next step's LR from this run's schedule, not the checkpoint's. With
    another --max-steps the cosine decay is stretched to end there (the warmup stays), unless
    --lr-decay-steps fixes its end; with the same one, the saved value bit for bit."""
    for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base_lr * lr_factor(scheduler.last_epoch, cfg)


def schedule_note(cfg: RunConfig, saved_max_steps: int, step: int, world_size: int) -> str:
    """One line on resuming with another --max-steps: what the LR does now; '' otherwise."""
    if saved_max_steps == cfg.max_steps or step >= cfg.max_steps:
        return ""
    if cfg.lr_decay_steps:  # the schedule ends there, whatever --max-steps says
        return ""
    peak, old = peak_lr(cfg, world_size), replace(cfg, max_steps=saved_max_steps)
    return (
        f"--max-steps {cfg.max_steps} (the checkpoint's run: {saved_max_steps}): the LR schedule"
        f" is recomputed for {cfg.max_steps} steps; step {step + 1} uses lr"
        f" {peak * lr_factor(step, cfg):.2e}, as a run with --max-steps {cfg.max_steps} would"
        f" ({peak * lr_factor(step, old):.2e} on the old schedule)"
    )
