"""Generated trainer vs hand-written DDP, Accelerate and Fabric on one GPU: samples/s, TFLOP/s.

    bash bench/gpu.sh                                   # on a CUDA machine, about 10 minutes
    python -m bench.gpu --device cpu --tiny             # smoke test of this script on CPU

World size 1 under torchrun, bf16 autocast, the same timing method as `python -m bench`
(bench/timing.py), interleaved rounds. Workloads (--workloads):
- launch:  MLP 1024-4096x8-10 (122 M parameters), batch 256 x 4 micro-steps: small kernels, so
           the host (Python, data loading, syncs) decides the speed;
- compute: MLP 1024-8192x4-10 (210 M parameters), batch 4096 x 2: large matmuls, so the GPU does.
Achieved TFLOP/s = 6 x parameters x samples/s / 1e12 (forward 2, backward 4 FLOPs per parameter
and sample; the GELUs and the loss are ignored), printed next to the rate of a bf16 8192^3 matmul
measured in the same run: the chip's practical ceiling.

Contenders: reference (bench/loops.py, fused AdamW), generated (defaults: metrics every 10 steps,
evaluation and a checkpoint every 100, so the window holds one of each), generated-quiet (none of
them in the window), generated-compile (defaults plus --compile, when the trainer has it),
accelerate and fabric (when installed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .generated import render
from .harness import PACKAGE, Workload, environment, fmt, run_rounds, save_results, summarize, versions

WORKLOADS = {
    "launch": Workload(
        input_dim=1024, hidden_dim=4096, depth=8, batch_size=256, grad_accum_steps=4, num_samples=32768
    ),
    "compute": Workload(
        input_dim=1024, hidden_dim=8192, depth=4, batch_size=4096, grad_accum_steps=2, num_samples=65536
    ),
}
OPTIONAL = {"accelerate": "accelerate", "fabric": "lightning"}
TARGETS = {"generated": 0.97, "generated-quiet": 1.00}  # x reference, on every workload
MATMUL_TARGET = 0.6  # compute workload: generated at >= 0.6 of the matmul rate


def matmul_tflops(device: str, n: int = 8192, repeats: int = 50) -> float | None:
    """TFLOP/s of a bf16 n x n x n matmul on this GPU (None on CPU)."""
    if device != "cuda":
        return None
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(5):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n**3 * repeats / (start.elapsed_time(end) / 1e3) / 1e12


def trainer_has_compile(env: dict[str, str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.train", "--help"], env=env, capture_output=True, text=True
    )
    return "--compile" in done.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--workloads", default="launch,compute", help=f"any of {', '.join(WORKLOADS)}")
    p.add_argument("--num-workers", type=int, default=8, help="DataLoader workers (every contender)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--timed", type=int, default=100, help="100 holds the default eval + checkpoint")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS (default 4 on cuda, 1 on cpu)")
    p.add_argument("--contenders", help="comma-separated (default: all available)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU smoke test")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    workloads = {}
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            p.error(f"--workloads: unknown {name!r}; choose from {', '.join(WORKLOADS)}")
        w = replace(WORKLOADS[name], warmup=args.warmup, timed=args.timed, device=args.device)
        w = replace(w, precision=args.precision, num_workers=args.num_workers)
        if args.tiny:
            w = replace(w, input_dim=32, hidden_dim=64, depth=2, batch_size=8, num_samples=512)
            w = replace(w, warmup=2, timed=5, num_workers=0)
        workloads[name] = w
    threads = args.threads or (4 if args.device == "cuda" else 1)
    work = Path(tempfile.mkdtemp(prefix="ddp-bench-gpu-"))
    try:
        project = work / "project"
        render(project, PACKAGE)
        env = environment(threads, project)
        contenders = choose_contenders(args.contenders, env)
        peak = matmul_tflops(args.device)
        if peak:
            print(f"bf16 8192^3 matmul: {peak:.0f} TFLOP/s (this run's ceiling)", flush=True)
        results = {}
        for name, w in workloads.items():
            print(f"\nworkload {name}: {describe(w)}", flush=True)
            runs = run_rounds(contenders, [1], args.repeats, w, env, work, log=lambda m: print(m, flush=True))
            results[name] = report(name, w, runs, contenders, peak, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.gpu", *(argv if argv is not None else sys.argv[1:])]),
        "matmul_tflops": peak,
        "threads_per_process": threads,
        "versions": versions(),
        "workloads": results,
    }
    path = save_results("gpu", result, args.json)
    print(f"\nresults: {path}")
    failed = [r for w in results.values() for r in w["runs"] if "error" in r]
    return 1 if failed else 0


def choose_contenders(given: str | None, env: dict[str, str]) -> list[str]:
    if given:
        return given.split(",")
    contenders = ["reference", "generated", "generated-quiet"]
    if trainer_has_compile(env):
        contenders.append("generated-compile")
    for name, module in OPTIONAL.items():
        if importlib.util.find_spec(module) is not None:
            contenders.append(name)
        else:
            print(f"note: {name} is not installed; skipped", flush=True)
    return contenders


def describe(w: Workload) -> str:
    return (
        f"MLP {w.input_dim}-{w.hidden_dim}x{w.depth}-{w.num_classes} ({w.params() / 1e6:.1f} M"
        f" parameters), batch {w.batch_size} x {w.grad_accum_steps} micro-steps, {w.precision}"
    )


def report(
    name: str, w: Workload, runs: list[dict], contenders: list[str], peak: float | None, repeats: int
) -> dict[str, Any]:
    """Print the workload's table and targets; return its rows for the JSON."""
    summary = summarize(runs, contenders, [1])["1"]
    print(f"\n{name}: W=1, medians of {repeats} interleaved rounds")
    print(f"{'contender':<20}{'samples/s':>12}{'TFLOP/s':>10}{'x matmul':>10}{'x ref':>8}{'data wait':>11}")
    rows = {}
    for c in contenders:
        row = summary["contenders"][c]
        rate = row["median_samples_per_sec"]
        tflops = 6 * w.params() * rate / 1e12 if rate else None
        of_peak = tflops / peak if tflops and peak else None
        key = "self_data_wait_frac_median"
        waits = [r[key] for r in runs if r["contender"] == c and key in r]
        wait = sorted(waits)[len(waits) // 2] if waits else None
        rows[c] = {**row, "tflops": tflops, "fraction_of_matmul": of_peak, "data_wait_frac": wait}
        ratio = row["median_ratio_to_reference"]
        print(
            f"{c:<20}{fmt(rate, ',.0f'):>12}{fmt(tflops, '.1f'):>10}{fmt(of_peak, '.2f'):>10}"
            f"{fmt(ratio, '.3f'):>8}{fmt(None if wait is None else 100 * wait, '.1f') + '%':>11}"
        )
    for c, target in TARGETS.items():
        ratio = rows.get(c, {}).get("median_ratio_to_reference")
        if ratio is not None:
            print(f"target {c} >= {target:.2f}x reference: {ratio:.3f} {verdict(ratio >= target)}")
    parts = [summary.get(f"inrun_overhead_pct_{group}") for group in ("log_ckpt", "eval")]
    if None not in parts:
        print(f"logging + evaluation + checkpointing in the generated run: {sum(parts):.1f}% of step time")
    frac = rows.get("generated", {}).get("fraction_of_matmul")
    if name == "compute" and frac is not None:
        ok = verdict(frac >= MATMUL_TARGET)
        print(f"target generated >= {MATMUL_TARGET} of the matmul rate: {frac:.2f} {ok}")
    for r in runs:
        if "error" in r:
            print(f"note: round {r['round'] + 1} {r['contender']}: {r['error']}")
    return {"workload": {**asdict(w), "params": w.params()}, "rows": rows, "summary": summary, "runs": runs}


def verdict(ok: bool) -> str:
    return "[ok]" if ok else "[MISSED]"


if __name__ == "__main__":
    sys.exit(main())
