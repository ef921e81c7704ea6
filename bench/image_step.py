"""What the trainer's keyed dropout and its step's code cost the image model's step, A/B in one process.

    python -m bench.image_step            # 21 rounds of 5 steps per variant (~1 min idle, CPU)

The generated trainer's forward + backward differs from the hand-written loops' (bench.image) in
its dropout: KeyedDropout masks hashed from each sample's place in the global batch, set for each
micro-batch by keyed.batch (which finds the model's KeyedDropouts), where torch's nn.Dropout
draws from the process's generator; and in the code around the model's forward and backward
(step.forward_backward). One thread, the bench.image workload's model and batch
(mobilenet_v3_small, 64 px, 16 images, fp32), every variant its own copy of the same weights,
variants alternating within each round; medians of per-round ratios to `torch-dropout`:

- torch-dropout: torchvision's model as it is; cross-entropy, backward, zero_grad.
- keyed-dropout: the same model with its dropout converted (keyed.convert_dropout), each step
  inside keyed.batch, as the trainer's forward_backward runs it.
- trainer-step: the keyed model through the trainer's own step.forward_backward (one
  micro-batch: no_sync, keyed.batch, autocast and GradScaler disabled as at fp32, the loss
  divided by the window's length, the loss kept for logging), with the image task's own
  Task.loss.
- torch-dropout-again: a second copy of the first (the A/A control: what the method resolves).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

from .harness import PACKAGE
from .image import render_image_project

VARIANTS = ("torch-dropout", "keyed-dropout", "trainer-step", "torch-dropout-again")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.image_step", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--steps", type=int, default=5, help="per variant per round")
    p.add_argument("--model", default="mobilenet_v3_small")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-image-step-") as work:
        render_image_project(Path(work) / "project")
        sys.path.insert(0, str(Path(work) / "project" / "src"))
        keyed = importlib.import_module(f"{PACKAGE}.engine.keyed")
        trainer = importlib.import_module(f"{PACKAGE}.step")
        micro = importlib.import_module(f"{PACKAGE}.engine.loading").Micro
        image_task = importlib.import_module(f"{PACKAGE}.task")
        task = image_task.Task(image_task.TrainConfig(label_smoothing=0.0))  # its loss alone
        torch.manual_seed(0)
        base = torchvision.models.get_model(a.model, num_classes=8)
        models = {v: copy.deepcopy(base).train() for v in VARIANTS}
        keyed.convert_dropout(models["keyed-dropout"])
        keyed.convert_dropout(models["trainer-step"])
        scaler = torch.amp.GradScaler("cpu", enabled=False)  # as the trainer's at fp32
        images = torch.randn(a.batch_size, 3, a.image_size, a.image_size)
        labels = torch.randint(0, 8, (a.batch_size,))
        places = range(a.batch_size)

        def step(variant: str, index: int) -> None:
            model = models[variant]
            if variant == "trainer-step":
                window = [micro((images, labels), places)]
                trainer.forward_backward(model, window, task, "fp32", scaler, (0, index))
            elif variant == "keyed-dropout":
                with keyed.batch(model, 0, index, places, images.device):
                    loss = nn.functional.cross_entropy(model(images), labels)
                    loss.backward()
            else:
                nn.functional.cross_entropy(model(images), labels).backward()
            model.zero_grad(set_to_none=True)

        ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for index in range(2):  # warm-up
            for variant in VARIANTS:
                step(variant, index)
        for round_ in range(a.rounds):
            for variant in VARIANTS:
                started = time.process_time()
                for index in range(a.steps):
                    step(variant, round_ * a.steps + index)
                ms[variant].append((time.process_time() - started) * 1000 / a.steps)
    what = f"{a.model}, {a.image_size} px, batch {a.batch_size}, one thread"
    print(f"{what}: ms of CPU per forward + backward (median of {a.rounds} rounds), x torch-dropout")
    for variant in VARIANTS:
        ratio = statistics.median(x / b for x, b in zip(ms[variant], ms["torch-dropout"], strict=True))
        print(f"  {variant:<22}{statistics.median(ms[variant]):8.2f} ms  x{ratio:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
