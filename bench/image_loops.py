"""The image workload's contenders: three hand-written torchvision DDP loops and the generated trainer.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.image_loops \
        --contender reference-same-work --data-path DATA --image-size 64 --max-steps 24 ...

All four train the same torchvision model (--model, --num-classes of the folder) on the same
folder DATA/train/CLASS/*, per-rank batch --batch-size, no accumulation, under bench.timing's
clock. Each prints one result line on rank 0 with, inside the timed window, the seconds spent
waiting for the loader (`data_s`), in forward + backward (`compute_s`, DDP's all-reduce
included) and in the rest (`other_s`: clipping, the update, the schedule, bookkeeping).

- reference-same-work: what the generated trainer does, written the usual way:
  torchvision.datasets.ImageFolder + transforms (RandomResizedCrop, RandomHorizontalFlip,
  ToTensor, Normalize), DistributedSampler, a DataLoader with the trainer's workers, prefetch,
  persistent workers and pin_memory, DDP, fused AdamW (no decay on biases and norms), clipping
  at 1.0, linear warmup + cosine LR. BatchNorm over all ranks at W > 1 as the trainer's
  --sync-bn: torch's SyncBatchNorm on CUDA; on CPU (SyncBatchNorm refuses gloo) the project's
  own syncbn.convert_batchnorm. Dropout is torch's (the trainer's is keyed: keyed.py).
- examples-imagenet: the structure of pytorch/examples' imagenet/main.py `train()`: the same
  ImageFolder and transforms, a DataLoader without persistent workers (default prefetch),
  SGD (lr 0.1, momentum 0.9, weight decay 1e-4), AverageMeters for time, data time, loss
  (loss.item() every step), top-1 and top-5 (accuracy() every step), a progress line every
  10 steps, StepLR per epoch, no mixed precision, no SyncBatchNorm.
- timm-train: the structure of timm's train.py `train_one_epoch` with its default loader
  (`create_loader` with the prefetcher): the workers crop and flip as the others do but hand
  over uint8 tensors (a quarter of float32's bytes between processes), and the main process
  converts and normalises them on the device (PrefetchLoader); SGD as timm's `--opt sgd`
  (Nesterov, momentum 0.9, weight decay 2e-5 off biases and norms), label smoothing 0.1,
  `loss.item()` every step at W=1 only, at W>1 an all-reduce of the loss and `.item()` every
  `--log-interval` (50) steps, BatchNorm over all ranks at W > 1 as `--sync-bn` (converted as the
  reference's). timm's default ColorJitter(0.4) is left out: the same augmentation for all.
- generated: the rendered trainer (`<package>.train.main`, unmodified), with whatever flags
  follow `--`; the data wait is the trainer's own (forward_backward returns it).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms

from .generated import read_metrics, side_work_overhead_pct, time_side_work
from .loops import DTYPES, drain_and_destroy
from .timing import StepClock, Timers, emit

CONTENDERS = ("reference-same-work", "examples-imagenet", "timm-train", "generated")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contender", required=True, choices=CONTENDERS)
    p.add_argument("--package", default="benchproj", help="the rendered project's package")
    p.add_argument("--data-path", type=Path, help="DATA, with DATA/train/CLASS/*")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--model", default="mobilenet_v3_small")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timed", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=list(DTYPES))
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--log-interval", type=int, default=50, help="timm-train: its loss reduction")
    p.add_argument("--out-dir", type=Path, help="generated: the trainer's --out-dir")
    p.add_argument("trainer_args", nargs=argparse.REMAINDER, help="generated: -- TRAINER FLAGS")
    return p


def setup(args: argparse.Namespace) -> torch.device:
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(args.seed)
    return device


def image_folder(args: argparse.Namespace) -> torchvision.datasets.ImageFolder:
    augment = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    return torchvision.datasets.ImageFolder(str(args.data_path / "train"), augment)


def loader(dataset, args: argparse.Namespace, device: torch.device, same_as_trainer: bool):
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    workers = args.num_workers
    extra = {}
    if same_as_trainer and workers > 0:  # the trainer's settings (loading.py, data.prepare)
        extra = {"persistent_workers": True, "prefetch_factor": args.prefetch_factor}
    return sampler, DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        **extra,
    )


def batches(loader_: DataLoader, sampler: DistributedSampler):
    """Micro-batches forever, a new shuffle each epoch."""
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader_


class Split:
    """Seconds inside the clock's window: waiting for data, forward + backward, the rest."""

    def __init__(self, clock: StepClock) -> None:
        self.timers = Timers(clock)
        self.seconds = {"data_s": 0.0, "compute_s": 0.0}

    def add(self, key: str, started: float) -> None:
        if self.timers.active():
            self.seconds[key] += time.perf_counter() - started

    def next_batch(self, data):
        """The next batch, its wait counted as data_s."""
        started = time.perf_counter()
        batch = next(data)
        self.add("data_s", started)
        return batch

    def result(self, window_s: float) -> dict[str, float]:
        return {**self.seconds, "other_s": window_s - sum(self.seconds.values())}


def synced_ddp(args: argparse.Namespace, device: torch.device, world: int, classes: int) -> nn.Module:
    """--model in DDP, with BatchNorm over all ranks at W > 1 (as the trainer's --sync-bn):
    torch's SyncBatchNorm on CUDA; on CPU, where it refuses gloo, the project's syncbn.py."""
    model = torchvision.models.get_model(args.model, num_classes=classes)
    if world > 1 and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif world > 1:
        model = importlib.import_module(f"{args.package}.engine.syncbn").convert_batchnorm(model, False)
    model = model.to(device)
    if args.channels_last and device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.index is not None else None
    )


def run_reference(args: argparse.Namespace) -> None:
    device = setup(args)
    world = dist.get_world_size()
    dataset = image_folder(args)
    sampler, loader_ = loader(dataset, args, device, same_as_trainer=True)
    ddp = synced_ddp(args, device, world, len(dataset.classes))
    params = [p for p in ddp.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, fused=True)
    warmup = 20

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / max(1, args.max_steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    amp = torch.autocast(device.type, dtype=DTYPES[args.precision], enabled=args.precision != "fp32")
    clock = StepClock(args.warmup, args.timed)
    split = Split(clock)
    data = batches(loader_, sampler)
    for _ in range(args.max_steps):
        inputs, labels = split.next_batch(data)
        started = time.perf_counter()
        inputs = inputs.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with amp:
            loss = F.cross_entropy(ddp(inputs), labels)
        loss.backward()
        split.add("compute_s", started)
        nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    finish(args, clock, split, world, loss)


class AverageMeter:
    """A value's latest, sum and average (examples' AverageMeter, without its formatting)."""

    def __init__(self, name: str) -> None:
        self.name, self.val, self.sum, self.count, self.avg = name, 0.0, 0.0, 0, 0.0

    def update(self, val, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    """Top-k accuracies in percent, as examples computes them every step."""
    with torch.no_grad():
        _, pred = output.topk(max(topk), 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True) * (100.0 / target.size(0)) for k in topk]


def run_examples(args: argparse.Namespace) -> None:
    device = setup(args)
    world = dist.get_world_size()
    dataset = image_folder(args)
    sampler, loader_ = loader(dataset, args, device, same_as_trainer=False)
    model = torchvision.models.get_model(args.model, num_classes=len(dataset.classes)).to(device)
    model = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.index is not None else None
    )
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    clock = StepClock(args.warmup, args.timed, optimizer_type=torch.optim.SGD)
    split = Split(clock)
    steps = 0
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        # train(): one epoch, or until --max-steps
        batch_time, data_time = AverageMeter("Time"), AverageMeter("Data")
        losses, top1, top5 = AverageMeter("Loss"), AverageMeter("Acc@1"), AverageMeter("Acc@5")
        model.train()
        end = time.time()
        started = time.perf_counter()
        for i, (images, target) in enumerate(loader_):
            data_time.update(time.time() - end)
            split.add("data_s", started)
            started = time.perf_counter()
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            split.add("compute_s", started)  # backward below: moved in by hand
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))
            top5.update(acc5[0], images.size(0))
            optimizer.zero_grad()
            started = time.perf_counter()
            loss.backward()
            split.add("compute_s", started)
            optimizer.step()
            batch_time.update(time.time() - end)
            end = time.time()
            if i % 10 == 0 and dist.get_rank() == 0:
                print(f"Epoch: [{epoch}][{i}/{len(loader_)}] Time {batch_time.val:.3f} ({batch_time.avg:.3f})"
                      f" Data {data_time.val:.3f} Loss {losses.val:.4e} Acc@1 {float(top1.avg):6.2f}"
                      f" Acc@5 {float(top5.avg):6.2f}", flush=True)  # fmt: skip
            steps += 1
            if steps == args.max_steps:
                return finish(args, clock, split, world, loss)
            started = time.perf_counter()
        scheduler.step()


def run_timm(args: argparse.Namespace) -> None:
    device = setup(args)
    world = dist.get_world_size()
    crop = [transforms.RandomResizedCrop(args.image_size), transforms.RandomHorizontalFlip()]
    dataset = torchvision.datasets.ImageFolder(
        str(args.data_path / "train"), transforms.Compose([*crop, transforms.PILToTensor()])
    )
    sampler, loader_ = loader(dataset, args, device, same_as_trainer=True)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    model = synced_ddp(args, device, world, len(dataset.classes))
    channels_last = args.channels_last and device.type == "cuda"
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    groups = [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 2e-5}]
    optimizer = torch.optim.SGD(groups, lr=0.05, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    amp = torch.autocast(device.type, dtype=DTYPES[args.precision], enabled=args.precision != "fp32")
    clock = StepClock(args.warmup, args.timed, optimizer_type=torch.optim.SGD)
    split = Split(clock)
    losses = AverageMeter("Loss")
    data = batches(loader_, sampler)
    for step in range(args.max_steps):
        images, target = split.next_batch(data)
        started = time.perf_counter()
        # PrefetchLoader: to the device, then float and normalised there
        images = images.to(device, non_blocking=True).float().sub_(mean).div_(std)
        target = target.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with amp:
            loss = loss_fn(model(images), target)
        if world == 1:
            losses.update(loss.item(), images.size(0))
        optimizer.zero_grad()
        loss.backward()
        split.add("compute_s", started)
        optimizer.step()
        if world > 1 and step % args.log_interval == 0:
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            losses.update(reduced.item() / world, images.size(0))
    finish(args, clock, split, world, loss)


def finish(args, clock: StepClock, split: Split, world: int, loss: torch.Tensor) -> None:
    result = clock.result(args.batch_size * world)
    emit(
        {"contender": args.contender, "final_loss": float(loss), **result, **split.result(result["window_s"])}
    )
    drain_and_destroy()


def run_generated(args: argparse.Namespace) -> int:
    """The trainer under the clock; its forward_backward timed (it returns its data wait)."""
    argv = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    train = importlib.import_module(f"{args.package}.train")
    step = importlib.import_module(f"{args.package}.step")
    clock = StepClock(args.warmup, args.timed)
    timers = Timers(clock)
    time_side_work(args.package, timers)  # logging, checkpoints, evaluation: should be 0 here
    timers.wrap(step, "forward_backward", "compute_s", data_wait_from_result=True)
    status = train.main([*argv, "--out-dir", str(args.out_dir)])
    if status == 0:
        world = int(os.environ.get("WORLD_SIZE", 1))
        record = {"contender": args.contender, **clock.result(args.batch_size * world)}
        data_s, compute_s = timers.seconds["data (next(batches))"], timers.seconds["compute_s"]
        record.update(data_s=data_s, compute_s=compute_s, other_s=record["window_s"] - data_s - compute_s)
        record.update(side_work_overhead_pct(timers, record["window_s"]))
        record.update(read_metrics(args.out_dir, args.warmup, args.warmup + args.timed))
        emit(record)
    return status


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.warmup < 1 or args.warmup + args.timed > args.max_steps:
        raise SystemExit("need 1 <= --warmup and --warmup + --timed <= --max-steps")
    if args.contender == "generated":
        return run_generated(args)
    loops = {"reference-same-work": run_reference, "examples-imagenet": run_examples, "timm-train": run_timm}
    loops[args.contender](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
