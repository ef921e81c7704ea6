"""Measure candidate speed-ups of the generated trainer before making them in the template.

    python -m bench.experiments                   # every patch of bench/patches.py, W=1 and 2
    python -m bench.experiments --patches fused_adamw --repeats 5

Runs the generated trainer (no logging/eval/checkpoint in the window) with and without each
what-if patch, and with all of them, interleaved with the reference loop, on the workload of
`python -m bench`; reports the median of per-round ratios (patched / unpatched).
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
from .harness import (
    PACKAGE,
    Workload,
    environment,
    fmt,
    median_or_none,
    ratios,
    run_rounds,
    save_results,
    summarize,
)
from .patches import PATCHES


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.experiments", description=__doc__.splitlines()[0])
    p.add_argument("--patches", default=",".join(PATCHES), help=f"comma-separated subset of {list(PATCHES)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--timed", type=int, default=100)
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S")
    p.add_argument("--retry-above", type=float, metavar="F")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    names = args.patches.split(",")
    unknown = set(names) - set(PATCHES)
    if unknown:
        raise SystemExit(f"unknown patches {sorted(unknown)}; choose from {list(PATCHES)}")
    base = "generated-quiet"
    variants = [f"{base}+{n}" for n in names]
    if len(names) > 1:
        variants.append(f"{base}+{'+'.join(names)}")
    contenders = ["reference", base, *variants]
    world_sizes = [int(x) for x in args.world_sizes.split(",")]
    w = Workload(warmup=args.warmup, timed=args.timed)
    work = Path(tempfile.mkdtemp(prefix="ddp-bench-exp-"))
    try:
        project = work / "project"
        render(project, PACKAGE)
        runs = run_rounds(
            contenders,
            world_sizes,
            args.repeats,
            w,
            environment(args.threads, project),
            work,
            wait_quiet_s=args.wait_quiet,
            retry_above=args.retry_above,
            log=lambda m: print(m, flush=True),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, contenders, world_sizes)
    gains = {str(ws): {v: median_or_none(ratios(runs, v, base, ws)) for v in variants} for ws in world_sizes}
    cpu_gains = {
        str(ws): {v: median_or_none(ratios(runs, v, base, ws, "cpu_samples_per_sec")) for v in variants}
        for ws in world_sizes
    }
    print(f"\nmedian of per-round ratios over {args.repeats} rounds ({base} = trainer without the patch)")
    print("(wall: samples per wall second; cpu: per rank-0 CPU second, see bench/timing.py)")
    cols = "".join(f"{f'W={ws} wall':>11}{f'W={ws} cpu':>11}{'x ref':>7}" for ws in world_sizes)
    print(f"{'variant':<62}{cols}")
    for c in [base, *variants]:
        line = f"{c:<62}"
        for ws in world_sizes:
            wall = 1.0 if c == base else gains[str(ws)][c]
            cpu = 1.0 if c == base else cpu_gains[str(ws)][c]
            ref = summary[str(ws)]["contenders"][c]["median_ratio_to_reference"]
            line += f"{fmt(wall, '.3f'):>11}{fmt(cpu, '.3f'):>11}{fmt(ref, '.3f'):>7}"
        print(line)
    result = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.experiments", *(argv if argv is not None else sys.argv[1:])]),
        "workload": asdict(w),
        "gains_vs_unpatched": gains,
        "cpu_gains_vs_unpatched": cpu_gains,
        "summary": summary,
        "runs": runs,
    }
    path = save_results("experiments", result, args.json)
    print(f"\nresults: {path}")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
