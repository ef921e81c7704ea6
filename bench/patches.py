"""What-if changes to the generated trainer, applied at run time to measure a fix before making it.

`python -m bench.experiments` runs the generated trainer with and without each of these,
interleaved, and reports the gain. Each patch mimics a change one would make in the template
(named in its docstring); none changes what the trainer computes except as noted.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch


def fused_adamw(package: str) -> None:
    """optim.py: `torch.optim.AdamW(..., fused=True)` on CPU too (fused CPU AdamW exists since torch 2.4).

    Same update up to float rounding; numerically not bitwise identical to the for-loop AdamW.
    """
    original = torch.optim.AdamW.__init__

    @functools.wraps(original)
    def init(self: torch.optim.AdamW, params: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["fused"] = True
        kwargs.pop("foreach", None)
        original(self, params, *args, **kwargs)

    torch.optim.AdamW.__init__ = init  # type: ignore[method-assign]


def foreach_clip(package: str) -> None:
    """train.py: `clip_grad_norm_(..., foreach=True)` (the default uses foreach only on CUDA)."""
    original = torch.nn.utils.clip_grad_norm_
    torch.nn.utils.clip_grad_norm_ = functools.partial(original, foreach=True)


def sparse_flags(package: str, every: int = 10) -> None:
    """train.py/dist.py: agree on the SIGTERM/non-finite flags every `every` steps, not every step.

    A stand-in for a sync-free non-finite check (the gradient norm is already identical on every
    rank after DDP's all-reduce, so a local isfinite() agrees without a collective) plus a
    preemption check every k steps. Here the flags are simply computed locally in between.
    """
    dist = importlib.import_module(f"{package}.dist")
    original: Callable[..., list[bool]] = dist.any_rank
    calls = [0]

    def any_rank(flags: list[Any], device: torch.device) -> list[bool]:
        calls[0] += 1
        if calls[0] % every == 0:
            return original(flags, device)
        return [bool(torch.as_tensor(f)) for f in flags]

    dist.any_rank = any_rank


def batch_indexing(package: str) -> None:
    """data.py: read a micro-batch with one indexing op (BatchSampler, batch_size=None) instead
    of B per-sample __getitem__ calls and a collate. Works for TensorDataset-like datasets."""
    data = importlib.import_module(f"{package}.data")
    original = data.build_train_loader

    def build_train_loader(dataset: Any, cfg: Any, env: Any, device: torch.device) -> Any:
        loader, sampler = original(dataset, cfg, env, device)
        batches = torch.utils.data.BatchSampler(sampler, cfg.batch_size, drop_last=True)
        fast = torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            sampler=batches,
            num_workers=cfg.num_workers,
            pin_memory=device.type == "cuda",
            persistent_workers=cfg.num_workers > 0,
        )
        return fast, sampler

    data.build_train_loader = build_train_loader


PATCHES: dict[str, Callable[[str], None]] = {
    "fused_adamw": fused_adamw,
    "foreach_clip": foreach_clip,
    "sparse_flags": sparse_flags,
    "batch_indexing": batch_indexing,
}


def apply(names: list[str], package: str) -> None:
    for name in names:
        PATCHES[name](package)
