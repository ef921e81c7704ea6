"""Render a project from this repository's working tree, and run its trainer under the bench clock.

    python -m bench.generated --package demo --warmup 10 --timed 100 -- --max-steps 111 ...

runs `demo.train.main(argv)` unmodified, with bench.timing's StepClock installed, and prints the
result line on rank 0: throughput measured exactly as for the hand-written loops, plus what the
trainer itself wrote to OUT_DIR/metrics.jsonl over the timed steps (its own samples/s, which
leaves out logging and checkpoint time, and the share of step time spent waiting for data).
The project must be importable: PYTHONPATH=<project>/src.

It also times, inside the same run, the trainer's calls that are not training: metrics
(reduce_metrics, Logger.log), checkpoints (build_state, Checkpointer.save) and evaluation. Their seconds
inside the timed window, over the window's other seconds, are the overhead of logging,
checkpointing and evaluation at the configured intervals: measured in one run, so free of the
5-15 % that separate runs differ by on a shared machine. (On CPU every op is synchronous, so a
call's wall time is its cost; rank 0 writes, the other ranks wait for it in the next collective.)
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .timing import StepClock, Timers, emit

REPO = Path(__file__).resolve().parent.parent


def render(dest: Path, name: str = "benchproj", data: dict[str, str] | None = None) -> float:
    """Render the working tree's template (not committed HEAD) with the real CLI into dest.

    Returns the seconds the CLI took. The package name is `name` (with '-' as '_').
    """
    with tempfile.TemporaryDirectory(prefix="bench-tpl-") as tpl:
        shutil.copy2(REPO / "copier.yml", tpl)
        shutil.copytree(REPO / "template", Path(tpl) / "template")
        cmd = [sys.executable, "-m", "generator", name, "-y", "--template", tpl, "--dest", str(dest)]
        for key, value in (data or {}).items():
            cmd += ["--data", f"{key}={value}"]
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"rendering failed ({done.returncode}): {done.stderr.strip()}")
    return seconds


def read_metrics(out_dir: Path, first_step: int, last_step: int) -> dict[str, Any]:
    """The trainer's own figures for metrics lines in (first_step, last_step]."""
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    window = [r for r in records if first_step < r.get("step", 0) <= last_step]
    out: dict[str, Any] = {"metrics_lines": len(window)}
    for key in ("samples_per_sec", "data_wait_frac", "tokens_per_sec", "mfu"):
        values = [r[key] for r in window if isinstance(r.get(key), int | float)]
        if values:
            out[f"self_{key}_median"] = statistics.median(values)
    return out


# What is not training: (module, attribute, group) of the generated package.
SIDE_WORK = (
    ("metrics", "reduce_metrics", "log"),
    ("metrics.Logger", "log", "log"),
    ("checkpoint", "build_state", "checkpoint"),
    ("checkpoint.Checkpointer", "save", "checkpoint"),  # the stall; the write is a thread
    ("train", "evaluate", "eval"),
)


def time_side_work(package: str, timers: Timers) -> None:
    """Wrap the trainer's logging, checkpoint and evaluation calls with the window's timers
    (train.py calls them through their modules, so the wrappers are what it calls)."""
    for owner_path, attr, group in SIDE_WORK:
        module_name, _, cls = owner_path.partition(".")
        owner: Any = importlib.import_module(f"{package}.{module_name}")
        if cls:
            owner = getattr(owner, cls)
        timers.wrap(owner, attr, group)


def side_work_overhead_pct(timers: Timers, window_s: float) -> dict[str, float]:
    """Per group: 100 x its seconds inside the timed window / the window's other seconds."""
    other = window_s - sum(timers.seconds.values())
    out = {group: 100 * timers.seconds[group] / other for _, _, group in SIDE_WORK}
    out["log_ckpt"] = out["log"] + out["checkpoint"]
    return {f"inrun_overhead_pct_{k}": v for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="run a generated trainer under the bench clock")
    parser.add_argument("--package", required=True)
    parser.add_argument("--label", default="generated")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--timed", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--out-dir", type=Path, required=True, help="the trainer's --out-dir")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    train = importlib.import_module(f"{args.package}.train")
    clock = StepClock(args.warmup, args.timed)
    timers = Timers(clock, args.warmup, args.timed)
    time_side_work(args.package, timers)
    status = train.main([*argv, "--out-dir", str(args.out_dir)])
    if status == 0:
        record = {"contender": args.label, **clock.result(args.global_batch)}
        record.update(side_work_overhead_pct(timers, record["window_s"]))
        record.update(read_metrics(args.out_dir, args.warmup, args.warmup + args.timed))
        emit(record)
    sys.exit(status)


if __name__ == "__main__":
    main()
