"""In-process A/B of a what-if fix: the patch is switched on and off in alternating blocks of steps.

    python -m bench.ab                        # each toggleable patch, W=1 and W=2
    python -m bench.ab --patches fused_adamw --pairs 30

Separate runs on a shared or virtualised machine differ by 10-20% (other processes, other
virtual machines on the host), which buries a 2% gain. Here one run of the generated trainer
(no logging/eval/checkpoint) alternates blocks of `--block` optimizer steps without and with
the patch (bench/patches.py), both ranks in lock step. Neighbouring blocks share the
machine's conditions, so the median over block pairs of (time without / time with) is a
tight estimate of the speed-up. The first step of each block is left out, so that waiting
carried over from the previous block is not counted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import patches
from .generated import REPO, render
from .harness import PACKAGE, Workload, environment, save_results, torchrun
from .timing import emit, parse


def worker(args: argparse.Namespace) -> None:
    switch = patches.apply([args.patch], args.package, patches.Switch(on=False))
    times: list[tuple[float, float]] = []
    block, warmup = args.block, args.warmup

    def hook(optimizer: torch.optim.Optimizer, a: Any, k: Any) -> None:
        if type(optimizer) is not torch.optim.AdamW:
            return
        times.append((time.perf_counter(), time.process_time()))
        done = len(times)  # optimizer steps finished; the next one is step done + 1
        switch.on = done >= warmup and ((done - warmup) // block) % 2 == 1

    register_optimizer_step_post_hook(hook)
    train = importlib.import_module(f"{args.package}.train")
    status = train.main(args.trainer_args)
    if status != 0:
        sys.exit(status)
    # Step s (1-based) ran from times[s-2] to times[s-1], with the switch set after step s-1.
    pairs_wall, pairs_cpu = [], []
    for p in range(args.pairs):
        first_off = warmup + 2 * p * block + 1  # the block's first step, then block - 1 measured
        spans = {}
        for name, start in (("off", first_off), ("on", first_off + block)):
            steps = range(start + 1, start + block)
            if steps.stop - 1 > len(times):
                break
            spans[name] = [sum(times[s - 1][i] - times[s - 2][i] for s in steps) / len(steps) for i in (0, 1)]
        if len(spans) == 2:
            pairs_wall.append(spans["off"][0] / spans["on"][0])
            pairs_cpu.append(spans["off"][1] / spans["on"][1])
    emit(
        {
            "contender": f"ab:{args.patch}",
            "world_size": int(os.environ.get("WORLD_SIZE", 1)),
            "pairs": len(pairs_wall),
            "speedup_wall": statistics.median(pairs_wall),
            "speedup_cpu": statistics.median(pairs_cpu),
            "speedup_wall_quartiles": statistics.quantiles(pairs_wall, n=4),
            "pairs_wall": pairs_wall,
        }
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--package", default=PACKAGE, help=argparse.SUPPRESS)
    p.add_argument("--patch", help=argparse.SUPPRESS)
    p.add_argument("--patches", default=",".join(patches.TOGGLEABLE))
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--block", type=int, default=8, help="optimizer steps per on/off block")
    p.add_argument("--pairs", type=int, default=16, help="(off, on) block pairs")
    p.add_argument("--json", type=Path)
    p.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.worker:
        args.trainer_args = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
        worker(args)
        return
    names = args.patches.split(",")
    for name in names:
        if name not in patches.TOGGLEABLE:
            raise SystemExit(f"{name}: not toggleable step by step; choose from {patches.TOGGLEABLE}")
    w = Workload()
    steps = args.warmup + 2 * args.pairs * args.block + 1
    results = []
    with tempfile.TemporaryDirectory(prefix="ddp-bench-ab-") as tmp:
        project = Path(tmp) / "project"
        render(project, PACKAGE)
        env = environment(args.threads, project)
        for ws in [int(x) for x in args.world_sizes.split(",")]:
            for name in names:
                trainer = [*w.common_flags(), f"--max-steps={steps}", "--resume=never"]
                trainer += ["--log-every=1000000000", "--ckpt-every=0", "--eval-every=0"]
                trainer += [f"--out-dir={tmp}/run-{ws}-{name}"]
                runner = [
                    "--worker",
                    f"--patch={name}",
                    f"--warmup={args.warmup}",
                    f"--block={args.block}",
                    f"--pairs={args.pairs}",
                    "--",
                    *trainer,
                ]
                done = subprocess.run(
                    torchrun(ws, "bench.ab", runner), env=env, capture_output=True, text=True, cwd=REPO
                )
                result = parse(done.stdout)
                if result is None:
                    raise SystemExit(f"A/B run failed:\n{done.stderr[-3000:]}")
                results.append(result)
                q1, _, q3 = result["speedup_wall_quartiles"]
                print(
                    f"W={ws} {name:<14} speed-up x{result['speedup_wall']:.3f} wall"
                    f" (quartiles {q1:.3f}..{q3:.3f}), x{result['speedup_cpu']:.3f} CPU time,"
                    f" {result['pairs']} block pairs of {args.block} steps",
                    flush=True,
                )
    path = save_results("ab", results, args.json)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
