"""BatchNorm over 2 ranks vs one process, in float64 and float32, and why float32 differs.

    python -m bench.batchnorm                       # resnet18, mobilenet_v3_small, 32 px, 2 x 16
    python -m bench.batchnorm --models resnet18 --image-size 64

Renders a project with task=image from this repository's working tree and runs, under torchrun
with 2 gloo ranks on CPU, each model (random weights, the trainer's keyed dropout) on random
images: one process with torch's BatchNorm on the global micro-batch, and 2 ranks with the
project's GlobalBatchNorm (syncbn.py) under DDP, each on half of it (rank r: samples r, r+2,
...). Reports the largest difference of the gradients after one backward and of the model's
state (weights and running statistics) after 3 SGD steps; in float32 also one process against
itself in float64 (the model's own float32 error), how many ReLU inputs lie on the other side
of 0 in the 2-rank run, and the gradient difference left when the 2-rank run takes the
one-process run's ReLU decisions (0 where its input was not > 0).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .harness import PACKAGE, environment, save_results, stamp
from .image import render_image_project


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One rank: every model in float64 and float32; rank 0's result is the JSON printed."""
    import torch
    import torch.distributed as dist
    import torchvision
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    keyed = importlib.import_module(f"{PACKAGE}.engine.keyed")
    syncbn = importlib.import_module(f"{PACKAGE}.engine.syncbn")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu = torch.device("cpu")

    def build(name: str, dtype: torch.dtype) -> nn.Module:
        torch.manual_seed(0)
        model = keyed.convert_dropout(torchvision.models.get_model(name, weights=None, num_classes=4))
        for module in model.modules():
            if isinstance(module, nn.ReLU):
                module.inplace = False  # the same values; the hooks below see the input
        return model.to(dtype)

    generator = torch.Generator().manual_seed(1)
    shape = (args.steps, args.batch, 3, args.image_size, args.image_size)
    images = torch.randn(shape, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 4, (args.steps, args.batch), generator=generator)

    def run(model: nn.Module, places: range, steps: int, masks: list | None = None) -> tuple:
        """SGD steps on `places` of each global batch: the first step's gradients, the ReLU
        decisions of its forward, and the state at the end. `masks`: ReLU decisions to use."""
        seen: list[torch.Tensor] = []

        def relu(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
            seen.append(inputs[0] > 0)
            if masks is not None and len(seen) <= len(masks):
                return inputs[0] * masks[len(seen) - 1][places].to(output.dtype)
            return None

        hooks = [m.register_forward_hook(relu) for m in model.modules() if isinstance(m, nn.ReLU)]
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        dtype = next(model.parameters()).dtype
        grads, decisions = {}, []
        for step in range(steps):
            optimizer.zero_grad()
            with keyed.batch(model, 0, step, places, cpu):
                out = model(images[step, places].to(dtype))
            nn.functional.cross_entropy(out, labels[step, places]).backward()
            if step == 0:
                inner = getattr(model, "module", model)
                grads = {k: p.grad.double().clone() for k, p in inner.named_parameters()}
                decisions = list(seen)
            optimizer.step()
        for hook in hooks:
            hook.remove()
        state = {k: v.double().clone() for k, v in getattr(model, "module", model).state_dict().items()}
        return grads, decisions, state

    def gap(a: dict, b: dict) -> tuple[float, str]:
        name = max(a, key=lambda k: (a[k] - b[k]).abs().max().item())
        return (a[name] - b[name]).abs().max().item(), name

    def two_ranks(name: str, dtype: torch.dtype, steps: int, masks: list | None = None) -> tuple:
        model = DistributedDataParallel(syncbn.convert_batchnorm(build(name, dtype), cuda=False))
        return run(model, range(rank, args.batch, world), steps, masks)

    everything = range(args.batch)
    results: dict[str, Any] = {}
    for name in args.models:
        row: dict[str, Any] = {}
        reference64 = None
        for dtype in (torch.float64, torch.float32):
            one_grads, one_masks, one_state = run(build(name, dtype), everything, args.steps)
            two_grads, two_masks, _ = two_ranks(name, dtype, 1)
            _, _, two_state = two_ranks(name, dtype, args.steps)
            flips = torch.tensor(
                sum(int((a != b[rank::world]).sum()) for a, b in zip(two_masks, one_masks, strict=True))
            )
            dist.all_reduce(flips)
            forced, _, _ = two_ranks(name, dtype, 1, masks=one_masks)
            figures = {
                "grad_gap": gap(two_grads, one_grads),
                "largest_grad": max(g.abs().max().item() for g in one_grads.values()),
                "state_gap": gap(two_state, one_state),
                "relu_flips": int(flips),
                "relu_inputs": sum(m.numel() for m in one_masks),
                "grad_gap_same_relu": gap(forced, one_grads),
            }
            if reference64 is None:
                reference64 = one_grads
            else:
                figures["one_process_vs_float64"] = gap(one_grads, reference64)
            row[str(dtype).removeprefix("torch.")] = figures
        results[name] = row
    dist.destroy_process_group()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batchnorm", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--models", type=lambda s: s.split(","), default=["resnet18", "mobilenet_v3_small"])
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32, help="the global micro-batch (2 ranks x half)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.worker:
        results = worker(args)
        if os.environ["RANK"] == "0":  # one writer: torchrun joins the ranks' stdout into one stream
            print(json.dumps(results), flush=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-batchnorm-"))
    try:
        project = work / "project"
        render_image_project(project)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        cmd += ["-m", "bench.batchnorm", "--worker", *(argv if argv is not None else sys.argv[1:])]
        done = subprocess.run(cmd, env=environment(1, project), capture_output=True, text=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    results = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"2 ranks x {args.batch // 2} vs 1 process x {args.batch}, {args.image_size} px, SGD lr {args.lr}:")
    for name, row in results.items():
        for dtype, f in row.items():
            line = (
                f"  {name} {dtype}: gradients {f['grad_gap'][0]:.1e} ({f['grad_gap'][1]}; largest"
                f" {f['largest_grad']:.1f}), after {args.steps} steps {f['state_gap'][0]:.1e}"
                f" ({f['state_gap'][1]}); ReLU inputs on the other side of 0: {f['relu_flips']}"
                f" of {f['relu_inputs']}; with the same ReLU decisions {f['grad_gap_same_relu'][0]:.1e}"
            )
            if "one_process_vs_float64" in f:
                line += f"; 1 process float32 vs float64 {f['one_process_vs_float64'][0]:.1e}"
            print(line)
    path = save_results(
        "batchnorm",
        {**stamp("python -m bench.batchnorm", argv), "args": vars(args) | {"json": None}, "results": results},
        args.json,
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
