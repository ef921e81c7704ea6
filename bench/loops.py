"""The hand-written contenders: one training loop per framework, on the benchmark workload.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.loops \
        --contender reference --max-steps 111 --warmup 10 --timed 100

Contenders (all train the same MLP on the same synthetic data with AdamW, per-rank batch B,
A micro-steps per optimizer step, loss / A per micro-step; no logging, no checkpoints):

- reference-same-work: what the generated trainer does at its defaults, written plainly (the
              contender the bench's targets compare with): DistributedSampler + DDP +
              `no_sync()` on all micro-steps but the last, fused AdamW (weight decay on
              matrices only), clip_grad_norm_ at 1.0, the trainer's warmup + cosine schedule,
              and no update when the gradient norm is not finite.
- reference:  the same loop without clipping, schedule or non-finite check, with torch's
              default (for-loop) AdamW on CPU.
- reference-fused: the reference with AdamW(fused=True) on CPU too.
- allreduce:  the same loop without no_sync: DDP all-reduces after every micro-step, the way
              most tutorials accumulate.
- accelerate: Hugging Face Accelerate, Accelerator(gradient_accumulation_steps=A) and
              `with accelerator.accumulate(model)`, prepare()d model/optimizer/loader.
- fabric:     Lightning Fabric, strategy="ddp", `fabric.no_backward_sync()` on all micro-steps
              but the last.

Each prints one result line (see bench.timing) on rank 0. `run_ddp` is also the loop of the
language-model workload (bench/lm_loop.py), on another dataset and model.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from .timing import StepClock, emit

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--contender",
        required=True,
        choices=["reference-same-work", "reference", "reference-fused", "allreduce", "accelerate", "fabric"],
    )
    p.add_argument("--num-samples", type=int, default=8192)
    p.add_argument("--input-dim", type=int, default=256)
    p.add_argument("--hidden-dim", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank per micro-step")
    return add_loop_flags(p)


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse a loop's flags and check that its window fits in its steps."""
    args = p.parse_args(argv)
    if args.warmup < 1 or args.warmup + args.timed > args.max_steps:
        raise SystemExit("need 1 <= --warmup and --warmup + --timed <= --max-steps")
    return args


def add_loop_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags every hand-written loop takes (this one's and bench/lm_loop.py's)."""
    p.add_argument("--grad-accum-steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    # reference-same-work only: the generated trainer's defaults.
    p.add_argument("--weight-decay", type=float, default=0.01, help="on matrices only")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--warmup-steps", type=int, default=20, help="of the LR schedule")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--max-steps", type=int, default=111, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=10, help="optimizer steps before the window")
    p.add_argument("--timed", type=int, default=100, help="optimizer steps in the window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", default="fp32", choices=list(DTYPES))
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    return p


def make_dataset(num: int, input_dim: int, num_classes: int, seed: int) -> TensorDataset:
    """Gaussian inputs labelled by a random teacher network, as the generated project does."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(input_dim, 64, generator=g) / input_dim**0.5
    w2 = torch.randn(64, num_classes, generator=g) / 8.0
    inputs = torch.randn(num, input_dim, generator=torch.Generator().manual_seed(seed + 1))
    labels = (torch.tanh(inputs @ w1) @ w2).argmax(dim=1)
    return TensorDataset(inputs, labels)


def make_mlp(args: argparse.Namespace) -> nn.Module:
    """depth x (Linear + GELU), then Linear: the generated project's MLP."""
    layers: list[nn.Module] = []
    width = args.input_dim
    for _ in range(args.depth):
        layers += [nn.Linear(width, args.hidden_dim), nn.GELU()]
        width = args.hidden_dim
    layers.append(nn.Linear(width, args.num_classes))
    return nn.Sequential(*layers)


def epochs(loader: DataLoader, sampler: DistributedSampler | None):
    """Micro-batches forever, a new shuffle each epoch."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def workers(args: argparse.Namespace) -> dict:
    return {"num_workers": args.num_workers, "persistent_workers": args.num_workers > 0}


def drain_and_destroy() -> None:
    """gloo teardown on torch 2.13 can abort at exit; end with barriers (see DESIGN.md)."""
    if dist.is_initialized():
        for _ in range(2):
            time.sleep(0.05)
            dist.barrier()
        time.sleep(0.05)
        dist.destroy_process_group()


# What a DDP run trains: (args, device) -> dataset, model on the CPU. Called once the process
# group is up and the global seed is set, so the model's initial weights come from the seed.
Build = Callable[[argparse.Namespace, torch.device], tuple[Dataset, nn.Module]]


def build_mlp(args: argparse.Namespace, device: torch.device) -> tuple[Dataset, nn.Module]:
    """The classifier workload: the teacher-labelled Gaussian data and the MLP."""
    return make_dataset(args.num_samples, args.input_dim, args.num_classes, args.seed), make_mlp(args)


def same_work_optimizer(
    model: nn.Module, args: argparse.Namespace
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The generated trainer's optimizer and schedule at its defaults: fused AdamW, weight decay
    on matrices only; the LR rises linearly over --warmup-steps, then follows a cosine down to
    --min-lr-ratio of the peak at --max-steps."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": matrices, "weight_decay": args.weight_decay},
        {"params": others, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, fused=True)

    def factor(step: int) -> float:
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        done = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
        return args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def run_ddp(args: argparse.Namespace, build: Build, fused: bool) -> None:
    """The reference loop, and for the allreduce contender the same without no_sync (an
    all-reduce after every micro-step), on what `build` makes; fused: AdamW(fused=True).
    reference-same-work adds what the generated trainer does at its defaults (see the top)."""
    use_no_sync = args.contender != "allreduce"
    same_work = args.contender == "reference-same-work"
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    dataset, model = build(args, device)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        drop_last=True,
        pin_memory=device.type == "cuda",
        **workers(args),
    )
    ddp = nn.parallel.DistributedDataParallel(
        model.to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    if same_work:
        optimizer, scheduler = same_work_optimizer(model, args)
    else:
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01, fused=fused)
    amp = torch.autocast(device.type, dtype=DTYPES[args.precision], enabled=args.precision != "fp32")
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    clock = StepClock(args.warmup, args.timed)
    batches = epochs(loader, sampler)
    accum = args.grad_accum_steps
    for _ in range(args.max_steps):
        for micro in range(accum):
            inputs, targets = next(batches)
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            skip_sync = use_no_sync and micro < accum - 1
            with ddp.no_sync() if skip_sync else contextlib.nullcontext():
                with amp:
                    # (B, classes) stays as it is; the GPT's (B, T, vocab) becomes (B * T, vocab).
                    loss = F.cross_entropy(ddp(inputs).flatten(0, -2), targets.flatten())
                scaler.scale(loss / accum).backward()
        if same_work:
            scaler.unscale_(optimizer)  # fp16: clip the true gradients
            grad_norm = nn.utils.clip_grad_norm_(ddp.parameters(), args.grad_clip)
            # Every rank holds the same gradients, so all skip a non-finite update together.
            # (A host read: free on a CPU; on a GPU the trainer skips it on the device instead.)
            if scaler.is_enabled() or grad_norm.isfinite():
                scaler.step(optimizer)
            scaler.update()
            scheduler.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
    finish(args, clock, world, loss)


def finish(args: argparse.Namespace, clock: StepClock, world: int, loss: torch.Tensor) -> None:
    """Print the result line (rank 0) and leave the process group."""
    result = clock.result(args.batch_size * args.grad_accum_steps * world)
    emit({"contender": args.contender, "final_loss": float(loss), **result})
    drain_and_destroy()


def framework_inputs(args: argparse.Namespace) -> tuple[DataLoader, nn.Module, torch.optim.Optimizer]:
    """The plain loader, model and optimizer that Accelerate and Fabric wrap: each shards the
    loader itself (batch_size stays per process). Fused AdamW on GPUs only: on CPU both get
    torch's default, the for-loop implementation, as the reference does."""
    torch.manual_seed(args.seed)
    dataset, model = build_mlp(args, torch.device(args.device))
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
        pin_memory=args.device == "cuda", **workers(args),
    )  # fmt: skip
    fused = args.device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=fused)
    return loader, model, optimizer


def run_accelerate(args: argparse.Namespace) -> None:
    from accelerate import Accelerator

    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[args.precision]
    accelerator = Accelerator(
        gradient_accumulation_steps=args.grad_accum_steps, cpu=args.device == "cpu", mixed_precision=mixed
    )
    loader, model, optimizer = framework_inputs(args)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    clock = StepClock(args.warmup, args.timed)
    batches = epochs(loader, None)
    for _ in range(args.max_steps * args.grad_accum_steps):
        inputs, labels = next(batches)
        # accumulate() skips the gradient sync and optimizer.step() until the A-th micro-step,
        # and accelerator.backward() divides the loss by A.
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finish(args, clock, accelerator.num_processes, loss)


def run_fabric(args: argparse.Namespace) -> None:
    from lightning.fabric import Fabric

    world = int(os.environ.get("WORLD_SIZE", 1))
    precision = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[args.precision]
    fabric = Fabric(accelerator=args.device, devices=world, strategy="ddp", precision=precision)
    fabric.launch()  # under torchrun: joins the existing processes
    loader, model, optimizer = framework_inputs(args)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)  # swaps in a DistributedSampler, moves batches
    clock = StepClock(args.warmup, args.timed)
    batches = epochs(loader, None)  # Fabric's loader calls set_epoch itself
    accum = args.grad_accum_steps
    for _ in range(args.max_steps):
        for micro in range(accum):
            inputs, labels = next(batches)
            with fabric.no_backward_sync(model, enabled=micro < accum - 1):
                loss = F.cross_entropy(model(inputs), labels)
                fabric.backward(loss / accum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    finish(args, clock, fabric.world_size, loss)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    if args.contender in ("reference-same-work", "reference", "reference-fused", "allreduce"):
        # Fused AdamW: the fastest on GPUs; on CPU only for reference-fused (torch's default
        # there is the for-loop implementation, which Accelerate and Fabric get too), and for
        # reference-same-work, which builds the generated trainer's optimizer (fused everywhere).
        fused = torch.device(args.device).type == "cuda" or args.contender == "reference-fused"
        run_ddp(args, build_mlp, fused)
    elif args.contender == "accelerate":
        run_accelerate(args)
    else:
        run_fabric(args)


if __name__ == "__main__":
    main()
