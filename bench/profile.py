"""Where the generated trainer's step time goes, and how long it waits for data.

    python -m bench.profile                  # breakdown at W=1 and W=2, data wait at 0 and 2 workers
    python -m bench.profile --py-spy         # also a py-spy sampling profile of a W=1 run

1. Breakdown: the trainer runs unmodified, but the functions its loop calls (looked up by name at
   call time) are wrapped with wall-clock timers: data loading, forward+backward, gradient
   clipping, the per-step any-rank flag all-reduce, the optimizer and scheduler steps,
   zero_grad, metrics, evaluation and checkpoints. On CPU every op is synchronous, so each
   timer holds that component's real cost. Reported per optimizer step over the timed window,
   with the calls that would block the host on a GPU (Tensor.item/tolist/__bool__/__float__).
2. Data wait: the share of step time the trainer itself reports (metrics.jsonl data_wait_frac,
   worst rank) at --num-workers 0 and 2.
3. With --py-spy (pip install py-spy): the lines of the generated code and the innermost frames
   holding the most samples of a W=1 run.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .generated import REPO, TRAINER_CALLS, read_metrics, render, trainer_call_owner
from .harness import (
    PACKAGE,
    Workload,
    environment,
    first_exception,
    fmt,
    pct,
    save_results,
    stamp,
    torchrun,
    trainer_flags,
)
from .timing import StepClock, Timers, emit, parse

SYNC_METHODS = ("item", "tolist", "__bool__", "__float__", "__int__")


def worker(args: argparse.Namespace) -> None:
    """Inside torchrun: run the trainer with timers; rank 0 prints the breakdown."""
    train = importlib.import_module(f"{args.package}.train")
    clock = StepClock(args.warmup, args.timed)
    t = Timers(clock)
    for call in TRAINER_CALLS:
        owner = trainer_call_owner(args.package, call)
        t.wrap(owner, call.attr, call.label, data_wait_from_result=call.data_wait_from_result)
    t.wrap(torch.nn.utils, "clip_grad_norm_", "clip_grad_norm_")
    nonfinite = importlib.import_module(f"{args.package}.engine.nonfinite")
    step = importlib.import_module(f"{args.package}.step")
    # The update as the trainer applies it: the fused AdamW step with found_inf (the non-finite
    # skip on the device), or scaler.step + update (fp16).
    t.wrap(step, "update", "optimizer step (step.update)")
    t.wrap(nonfinite.Health, "note", "non-finite check: Health.note (device ops)")
    t.wrap(nonfinite.Health, "check", "non-finite check: Health.check (at logged steps)")
    t.wrap(torch.amp.GradScaler, "unscale_", "scaler.unscale_")
    t.wrap(torch.optim.lr_scheduler.LambdaLR, "step", "scheduler.step")
    t.wrap(torch.optim.Optimizer, "zero_grad", "zero_grad")
    for method in SYNC_METHODS:
        t.count(torch.Tensor, method, f"Tensor.{method}")
    w = Workload(warmup=args.warmup, timed=args.timed)
    status = train.main([*trainer_flags(w), f"--out-dir={args.out_dir}", *args.extra])
    if status != 0:
        sys.exit(status)
    res = clock.result(w.batch_size * w.grad_accum_steps * int(os.environ.get("WORLD_SIZE", 1)))
    step_ms = 1000 * res["window_s"] / args.timed
    # The timers see steps warmup+1..warmup+timed; the window is the same number of steps,
    # shifted by the part of a step after optimizer.step (close enough for shares).
    parts = {k: 1000 * v / args.timed for k, v in t.seconds.items()}
    parts["other (loop bookkeeping, Python)"] = step_ms - sum(parts.values())
    calls = {k: v / args.timed for k, v in t.calls.items()}
    syncs = {k: v / args.timed for k, v in t.syncs.items()}
    emit(
        {
            "contender": "profile",
            **res,
            "step_ms": step_ms,
            "ms_per_step": parts,
            "calls_per_step": calls,
            "host_syncs_per_step": syncs,
        }
    )


def reference_worker(args: argparse.Namespace) -> None:
    """Inside torchrun: bench.loops' reference-same-work with timers on the same calls (the
    loop is inline, so forward + backward is what the timed calls leave of a step)."""
    from . import loops

    clock = StepClock(args.warmup, args.timed)
    t = Timers(clock)
    t.wrap(torch.utils.data.dataloader._BaseDataLoaderIter, "__next__", "data (next(batches))")
    t.wrap(torch.nn.utils, "clip_grad_norm_", "clip_grad_norm_")
    t.wrap(torch.optim.AdamW, "step", "optimizer step (fused AdamW)")
    t.wrap(torch.optim.lr_scheduler.LambdaLR, "step", "scheduler.step")
    t.wrap(torch.optim.Optimizer, "zero_grad", "zero_grad")
    w = Workload(warmup=args.warmup, timed=args.timed)
    timing = [f"--warmup={w.warmup}", f"--timed={w.timed}"]
    loops.main(["--contender=reference-same-work", *w.common_flags(), *timing])
    res = clock.result(w.batch_size * w.grad_accum_steps * int(os.environ.get("WORLD_SIZE", 1)))
    step_ms = 1000 * res["window_s"] / args.timed
    parts = {k: 1000 * v / args.timed for k, v in t.seconds.items()}
    parts["forward+backward, isfinite, loop (the rest)"] = step_ms - sum(parts.values())
    calls = {k: v / args.timed for k, v in t.calls.items()}
    emit(
        {
            "contender": "profile-reference",
            **res,
            "step_ms": step_ms,
            "ms_per_step": parts,
            "calls_per_step": calls,
        }
    )


def run_breakdown(
    world_size: int, env: dict[str, str], warmup: int, timed: int, reference: bool = False
) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-prof-") as out:
        flags = ["--worker", f"--warmup={warmup}", f"--timed={timed}", f"--out-dir={out}"]
        cmd = torchrun(world_size, "bench.profile", [*flags, *(["--reference"] if reference else [])])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    result = parse(done.stdout)
    if result is None:
        raise RuntimeError(f"profile run failed: {first_exception(done.stderr)}\n{done.stderr[-2000:]}")
    return result


def run_data_wait(world_size: int, workers: int, env: dict[str, str], warmup: int, timed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-dw-") as out:
        flags = trainer_flags(Workload(warmup=warmup, timed=timed))
        cmd = torchrun(  # --num-workers: the later flag wins
            world_size, f"{PACKAGE}.train", [*flags, f"--num-workers={workers}", f"--out-dir={out}"]
        )
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"data-wait run failed: {first_exception(done.stderr)}\n{done.stderr[-2000:]}")
        return read_metrics(Path(out), warmup, warmup + timed)


def loop_lines(project: Path) -> range:
    """Lines of the training loop: the `while` statement in train() of the rendered train.py."""
    tree = ast.parse((project / "src" / PACKAGE / "train.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "train":
            for inner in ast.walk(node):
                if isinstance(inner, ast.While):
                    return range(inner.lineno, (inner.end_lineno or inner.lineno) + 1)
    raise RuntimeError("no `while` loop in train() of train.py")


def run_py_spy(
    project: Path, env: dict[str, str], steps: int, top: int
) -> dict[str, list[tuple[str, float]]]:
    """A py-spy sampling profile of a W=1 run (raw collapsed stacks), two views of the samples
    taken inside the training loop (set-up and teardown left out): the innermost line of the
    generated package on the stack (what the trainer's own code costs, callees included), and
    the innermost frame (where the CPU is)."""
    loop = loop_lines(project)
    in_loop = re.compile(rf"^train \({PACKAGE}/train\.py:(\d+)\)$")
    if shutil.which("py-spy") is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    with tempfile.TemporaryDirectory(prefix="bench-spy-") as out:
        raw = Path(out) / "profile.txt"
        cmd = [  # --max-steps: the later flag wins
            "py-spy", "record", "--format", "raw", "--rate", "200", "--native", "-o", str(raw), "--",
            sys.executable, "-m", f"{PACKAGE}.train", *trainer_flags(Workload()), f"--max-steps={steps}",
            f"--out-dir={out}/run",
        ]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy failed (it needs ptrace permission): {done.stderr[-1000:]}")
        ours: collections.Counter[str] = collections.Counter()
        leaves: collections.Counter[str] = collections.Counter()
        total = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            lines = [int(m.group(1)) for f in frames if (m := in_loop.match(f))]
            if not lines or lines[0] not in loop:
                continue  # start-up and teardown
            n = int(count)
            total += n
            leaves[frames[-1]] += n
            mine = [f for f in frames if f"({PACKAGE}/" in f]
            ours[mine[-1] if mine else "?"] += n
    share = {"trainer_lines": ours.most_common(top), "leaf_frames": leaves.most_common(top)}
    return {view: [(frame, n / total) for frame, n in rows] for view, rows in share.items()}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--package", default=PACKAGE, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--timed", type=int, default=100)
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process")
    p.add_argument("--py-spy", action="store_true", help="also sample a W=1 run with py-spy")
    p.add_argument("--py-spy-steps", type=int, default=300, help="optimizer steps of the py-spy run")
    p.add_argument("--no-breakdown", action="store_true", help="skip the timer breakdown and data wait")
    p.add_argument("--no-data-wait", action="store_true", help="skip the data-wait runs (0 and 2 workers)")
    p.add_argument(
        "--reference", action="store_true", help="also break down bench.loops' reference-same-work"
    )
    p.add_argument("--json", type=Path)
    p.add_argument("extra", nargs="*", help="extra trainer flags (worker only)")
    args = p.parse_args()
    if args.worker:
        if args.reference:
            reference_worker(args)
        else:
            worker(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    try:
        project = work / "project"
        render(project, PACKAGE)
        # glibc's own malloc (not harness.PIN_MALLOC): the profile shows the trainer as a
        # user's run has it, page faults included.
        env = environment(args.threads, project, pin_malloc=False)
        report: dict[str, Any] = {
            **stamp("python -m bench.profile", None),
            "breakdown": {},
            "data_wait": {},
            "threads_per_process": args.threads,
        }
        for ws in [] if args.no_breakdown else [int(x) for x in args.world_sizes.split(",")]:
            if args.reference:
                b = run_breakdown(ws, env, args.warmup, args.timed, reference=True)
                report["breakdown"][f"{ws} reference-same-work"] = b
                print(f"\nW={ws} reference-same-work: {b['step_ms']:.2f} ms per optimizer step")
                for name, ms in sorted(b["ms_per_step"].items(), key=lambda kv: -kv[1]):
                    print(f"  {name:<45}{ms:>8.3f} ms {100 * ms / b['step_ms']:>6.1f}%")
            b = run_breakdown(ws, env, args.warmup, args.timed)
            report["breakdown"][str(ws)] = b
            print(
                f"\nW={ws}: {b['step_ms']:.2f} ms per optimizer step ({b['samples_per_sec']:,.0f} samples/s)"
            )
            for name, ms in sorted(b["ms_per_step"].items(), key=lambda kv: -kv[1]):
                calls = b["calls_per_step"].get(name)
                shown = f"{calls:.2f} calls/step" if calls is not None else ""
                print(f"  {name:<45}{ms:>8.3f} ms {100 * ms / b['step_ms']:>6.1f}%  {shown}")
            print("  calls that read a tensor's value on the host (a GPU sync for GPU tensors), per step:")
            for name, per_step in sorted(b["host_syncs_per_step"].items(), key=lambda kv: -kv[1]):
                print(f"    {per_step:6.2f}  {name}")
            for workers in () if args.no_data_wait else (0, 2):
                d = run_data_wait(ws, workers, env, args.warmup, args.timed)
                report["data_wait"][f"W={ws} workers={workers}"] = d
                frac, sps = d.get("self_data_wait_frac_median"), d.get("self_samples_per_sec_median")
                print(
                    f"  --num-workers {workers}: data wait {fmt(pct(frac), '.1f')}% of step time,"
                    f" trainer-reported {fmt(sps, ',.0f')} samples/s (median of its metrics lines)"
                )
        if args.py_spy:
            views = run_py_spy(project, env, args.py_spy_steps, 20)
            report["py_spy"] = views
            titles = {
                "trainer_lines": "innermost line of the generated code, callees included",
                "leaf_frames": "innermost frame (Python or native)",
            }
            for view, rows in views.items():
                print(f"\npy-spy, W=1, share of the samples in the training loop, by {titles[view]}:")
                for frame, share in rows:
                    print(f"  {100 * share:5.1f}%  {frame}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = save_results("profile", report, args.json)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
