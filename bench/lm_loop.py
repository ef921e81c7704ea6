"""The hand-written contender for the language-model workload: a plain DDP loop on the same GPT.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.lm_loop \
        --contender reference --data-path text.txt --max-steps 111 --warmup 10 --timed 100

The model is the rendered project's own GPT class (imported from it, so both contenders train
exactly the same network; what is compared is the loop around it). The data is the same text,
cut the way the generated trainer cuts it (the first 90 % for training, non-overlapping windows
of --seq-len + 1 bytes), but held in memory as one tensor: the fastest possible data path.

- reference: DistributedSampler + DDP + `no_sync()` on all micro-steps but the last, loss / A,
             fused AdamW (as the generated trainer uses); no clipping, schedule, logging,
             evaluation or checkpoints.
- allreduce: the same without no_sync (an all-reduce after every micro-step).

Prints one result line (bench.timing) on rank 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .loops import DTYPES, add_loop_flags, drain_and_destroy, epochs
from .timing import StepClock, emit


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contender", required=True, choices=["reference", "allreduce"])
    p.add_argument("--package", default="benchproj", help="the rendered project's package (its GPT)")
    p.add_argument("--data-path", required=True, help="UTF-8 text to train on")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="windows per rank per micro-step")
    return add_loop_flags(p)


def make_dataset(path: str, seq_len: int) -> TensorDataset:
    """Training windows of a text's bytes: inputs and the same shifted by one."""
    tokens = torch.from_numpy(np.fromfile(path, dtype=np.uint8).astype(np.int64))
    train = tokens[: int(len(tokens) * 0.9)]
    windows = (len(train) - 1) // seq_len
    index = torch.arange(windows)[:, None] * seq_len + torch.arange(seq_len + 1)
    chunks = train[index]
    return TensorDataset(chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous())


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.warmup < 1 or args.warmup + args.timed > args.max_steps:
        raise SystemExit("need 1 <= --warmup and --warmup + --timed <= --max-steps")
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("high")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    dataset = make_dataset(args.data_path, args.seq_len)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        pin_memory=device.type == "cuda", num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
    )  # fmt: skip
    gpt = importlib.import_module(f"{args.package}.model").GPT
    model = gpt(args.n_layer, args.n_head, args.d_model, args.seq_len).to(device)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01, fused=True)
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
            skip_sync = args.contender == "reference" and micro < accum - 1
            with ddp.no_sync() if skip_sync else contextlib.nullcontext():
                with amp:
                    logits = ddp(inputs)
                    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                scaler.scale(loss / accum).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    result = clock.result(args.batch_size * accum * world)
    emit({"contender": args.contender, "final_loss": float(loss), **result})
    drain_and_destroy()


if __name__ == "__main__":
    main()
