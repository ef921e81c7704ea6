"""What-if changes to the generated trainer, applied at run time to measure a fix before making it.

Each patch mimics a change one would make in the template (named in its docstring) and is
controlled by a Switch, so it can be on for a whole run (`python -m bench.experiments`, separate
processes) or flipped every optimizer step inside one run (`python -m bench.ab`: on and off
steps then share the machine's conditions, which makes small gains measurable on a noisy
machine). None changes what the trainer computes, except fused_adamw (float rounding).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch


class Switch:
    def __init__(self, on: bool = True) -> None:
        self.on = on


def fused_adamw(package: str, switch: Switch) -> None:
    """optim.py: `torch.optim.AdamW(..., fused=True)` on CPU (applied in the template since
    v0.2.0; off gives torch's CPU default, the for-loop AdamW, as before).

    Fused CPU AdamW exists since torch 2.4; same update up to float rounding.
    """
    original = torch.optim.AdamW.step

    @functools.wraps(original)
    def step(self: torch.optim.AdamW, *args: Any, **kwargs: Any) -> Any:
        for group in self.param_groups:
            if group["params"][0].device.type == "cpu":
                group["fused"], group["foreach"] = (True, False) if switch.on else (None, None)
        return original(self, *args, **kwargs)

    torch.optim.AdamW.step = step  # type: ignore[method-assign]


def async_flags(package: str, switch: Switch) -> None:
    """dist.py: the SIGTERM and save-by-time flags all-reduced in the background over the
    host group and collected a step later (AgreeLater). Off gives a blocking agreement within
    the step (`.wait()` right after starting it), the code before v0.3.0.
    """
    dist = importlib.import_module(f"{package}.dist")
    original = dist.AgreeLater.start

    def start(self: Any, **flags: int) -> None:
        original(self, **flags)
        if not switch.on:
            work, values = self._pending
            work.wait()
            values.tolist()

    dist.AgreeLater.start = start


def batch_indexing(package: str, switch: Switch) -> None:
    """data.py: read a micro-batch with one indexing op (a BatchSampler and batch_size=None)
    instead of B per-sample __getitem__ calls and a collate. For TensorDataset-like datasets.
    (Chosen when the loader is built: it cannot be flipped step by step.)"""
    data = importlib.import_module(f"{package}.data")
    original = data.build_train_loader

    def build_train_loader(dataset: Any, cfg: Any, env: Any, device: torch.device) -> Any:
        loader, sampler = original(dataset, cfg, env, device)
        if not switch.on:
            return loader, sampler
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


PATCHES: dict[str, Callable[..., None]] = {
    "fused_adamw": fused_adamw,
    "async_flags": async_flags,
    "batch_indexing": batch_indexing,
}
TOGGLEABLE = ("fused_adamw", "async_flags")


def apply(names: list[str], package: str, switch: Switch | None = None) -> Switch:
    """Install the named patches, all controlled by one switch (on unless given)."""
    switch = switch or Switch(on=True)
    for name in names:
        PATCHES[name](package, switch)
    return switch
