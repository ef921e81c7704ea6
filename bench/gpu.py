"""Generated trainer vs the hand-written reference loop on one GPU: samples/s and TFLOP/s.

    bash bench/gpu.sh                                   # on a CUDA machine, under 5 minutes
    python -m bench.gpu --device cpu --tiny             # smoke test of this script on CPU

World size 1 under torchrun, bf16 autocast, a larger MLP (default 1024-4096x8-10, per-rank
batch 256, 4 micro-steps), the same timing method as `python -m bench` (bench/timing.py).
Achieved TFLOP/s = 6 x parameters x samples/s / 1e12: forward (2 FLOPs per parameter and
sample) plus backward (4), the usual estimate for an MLP; it ignores the cheap GELU and loss.

Contenders: reference (bench/loops.py, fused AdamW on CUDA), generated (defaults: log every 10,
eval and a checkpoint every 100 steps, so the window holds one checkpoint, which at this model
size is ~1.5 GB written with fsync) and generated-quiet (no logging/eval/checkpoint in the
window: the training loop alone).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from .generated import render
from .harness import PACKAGE, Workload, environment, fmt, run_rounds, save_results, summarize, versions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--input-dim", type=int, default=1024)
    p.add_argument("--hidden-dim", type=int, default=4096)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256, help="per micro-step")
    p.add_argument("--grad-accum-steps", type=int, default=4)
    p.add_argument("--num-samples", type=int, default=32768)
    p.add_argument("--num-workers", type=int, default=8, help="DataLoader workers (both contenders)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--timed", type=int, default=100, help="100 holds the default eval + checkpoint")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS (default 4 on cuda, 1 on cpu)")
    p.add_argument("--contenders", default="reference,generated,generated-quiet")
    p.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU smoke test")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    w = Workload(
        input_dim=args.input_dim,
        hidden_dim=args.hidden_dim,
        depth=args.depth,
        num_classes=args.num_classes,
        batch_size=args.batch_size,
        grad_accum_steps=args.grad_accum_steps,
        num_samples=args.num_samples,
        warmup=args.warmup,
        timed=args.timed,
        device=args.device,
        precision=args.precision,
        num_workers=args.num_workers,
    )
    if args.tiny:
        w.input_dim, w.hidden_dim, w.depth, w.batch_size, w.num_samples = 32, 64, 2, 8, 512
        w.warmup, w.timed, w.num_workers = 2, 5, 0
    contenders = args.contenders.split(",")
    threads = args.threads or (4 if args.device == "cuda" else 1)
    work = Path(tempfile.mkdtemp(prefix="ddp-bench-gpu-"))
    try:
        project = work / "project"
        render(project, PACKAGE)
        env = environment(threads, project)
        runs = run_rounds(contenders, [1], args.repeats, w, env, work, log=lambda m: print(m, flush=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, contenders, [1])["1"]
    params = w.params()
    print(
        f"\nW=1, {args.device}, {args.precision}, MLP {w.input_dim}-{w.hidden_dim}x{w.depth}-{w.num_classes}"
        f" ({params / 1e6:.1f} M parameters), batch {w.batch_size} x {w.grad_accum_steps} micro-steps;"
        f" medians of {args.repeats} interleaved rounds"
    )
    print(f"{'contender':<18}{'samples/s':>12}{'TFLOP/s':>10}{'x ref':>8}")
    rows = {}
    for c in contenders:
        row = summary["contenders"][c]
        rate = row["median_samples_per_sec"]
        tflops = 6 * params * rate / 1e12 if rate else None
        rows[c] = {**row, "tflops": tflops}
        ratio = row["median_ratio_to_reference"]
        print(f"{c:<18}{fmt(rate, ',.0f'):>12}{fmt(tflops, '.2f'):>10}{fmt(ratio, '.3f'):>8}")
    for r in runs:
        if "error" in r:
            print(f"note: round {r['round'] + 1} {r['contender']}: {r['error']}")
    result = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.gpu", *(argv if argv is not None else sys.argv[1:])]),
        "workload": {**asdict(w), "params": params},
        "threads_per_process": threads,
        "versions": versions(),
        "rows": rows,
        "runs": runs,
    }
    path = save_results("gpu", result, args.json)
    print(f"\nresults: {path}")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
