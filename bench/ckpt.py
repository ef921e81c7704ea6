"""How long a background checkpoint stalls training, next to a synchronous save of the same state,
on an idle machine and on busy ones.

    python -m bench.ckpt                     # idle, busy, heavy: one run each (9 min on 2 shared cores)
    python -m bench.ckpt --rounds 2          # every load twice, interleaved
    python -m bench.ckpt --loads idle,heavy --saves 8

The workload is the one of issue 21: the generated trainer, run unmodified in one process
(`<package>.train.main`, as `python -m <package>.train` runs it), on an MLP 256 -> 2048 x 6 -> 10
(21 M parameters; 258 MB with AdamW's state), batch 16, fp32, CPU, a checkpoint every 10 steps,
a metrics line every step, no evaluation. It runs once per load, beside:

  idle    nothing of ours;
  busy    one CPU-bound process (a Python busy loop) per core;
  heavy   two per core, and a process writing 4 MB blocks to the same disk with an fsync each.

Inside each run (bench.timing's clock marks the end of every optimizer step):
  (a) the stall of a save: the extra time of the steps from the save to the end of its write
      (the background thread's), plus --tail steps, over the median time of the steps that no
      save or write touches. Split into the time inside Checkpointer.save (building the state
      and copying it: what the trainer reports as ckpt_stall_s) and the slowdown of the steps
      that run while the thread writes;
  (b) a synchronous `torch.save` + flush + fsync of the same state to the same directory, timed
      in the same process just before the save (the previous write is done by then), and
      subtracted from the step it sits in.
It prints a / b per load (the median over saves), their seconds, ckpt_stall_s from the
trainer's metrics.jsonl, the write's duration and the writer thread's CPU seconds, and the load:
the 1-minute load average at the end of the run and the share of the cores that processes other
than the trainer used during it. Target (issue 21): a / b <= 0.5 idle and busy.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .generated import TrainerCall, render, trainer_call_owner
from .harness import (
    PACKAGE,
    Workload,
    environment,
    fmt,
    git_state,
    pct,
    run_one,
    save_results,
    stamp,
    trainer_flags,
)
from .timing import StepClock, emit

# load -> (CPU-bound processes per core, a process writing to the disk with fsync)
LOADS = {"idle": (0, False), "busy": (1, False), "heavy": (2, True)}
TARGET_RATIO = 0.5  # issue 21: idle and busy
TARGET_LOADS = ("idle", "busy")
SPIN = "while True:\n    pass\n"
DISK_WRITER = """
import os, sys
block = os.urandom(4 << 20)
with open(sys.argv[1], "wb") as f:
    while True:
        for _ in range(64):  # 256 MB, then start over
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
        f.seek(0)
        f.truncate()
"""
# What the worker wraps in the rendered package (a rename stops the run with a message).
SAVE = TrainerCall("engine.checkpoint.Checkpointer", "save", "checkpoint: save (the stall)")
WRITE = TrainerCall("engine.checkpoint.Checkpointer", "_write", "checkpoint: the background write")


def workload(tiny: bool) -> Workload:
    w = Workload(input_dim=256, hidden_dim=2048, depth=6, batch_size=16, grad_accum_steps=1)
    if tiny:
        w.hidden_dim, w.depth, w.num_samples = 32, 1, 1024
    return w


def run_flags(w: Workload, ckpt_every: int, saves: int) -> list[str]:
    """The trainer's flags: `saves` measured saves, then a last step that saves (unmeasured)
    ckpt_every - 1 steps later, so the last measured write has steps to finish in."""
    return [
        *trainer_flags(w),  # the later flag wins
        f"--ckpt-every={ckpt_every}",
        "--ckpt-every-minutes=0",
        "--log-every=1",
        "--eval-every=0",
        f"--max-steps={ckpt_every * (saves + 1) - 1}",
    ]


def worker(args: argparse.Namespace) -> None:
    """Run the trainer with the clock and the save/write timers; print the raw timings."""
    train = importlib.import_module(f"{PACKAGE}.train")
    checkpointer = trainer_call_owner(PACKAGE, SAVE)
    trainer_call_owner(PACKAGE, WRITE)
    clock = StepClock(1, 1)  # only its timestamps: clock.times[n - 1] is the end of step n
    saves: list[dict[str, Any]] = []
    writes: list[dict[str, Any]] = []
    save, write = checkpointer.save, checkpointer._write

    def timed_save(self: Any, state: Any) -> float:
        record: dict[str, Any] = {"step": state.progress.step}
        if state.progress.step < self.cfg.max_steps:  # the last save is not measured
            started = time.perf_counter()
            payload = state.state_dict()
            built = time.perf_counter()
            scratch = Path(self.cfg.out_dir) / "sync-save.pt"
            with open(scratch, "wb") as file:
                torch.save(payload, file)
                file.flush()
                os.fsync(file.fileno())
            record["sync_save_s"] = time.perf_counter() - built
            scratch.unlink()
            del payload
            record["sync_total_s"] = time.perf_counter() - started  # subtracted from its step
        record["start"] = time.perf_counter()
        stalled = save(self, state)
        record["end"] = time.perf_counter()
        saves.append(record)
        return stalled

    def timed_write(self: Any, *args: Any, **kwargs: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return write(self, *args, **kwargs)
        finally:
            writes.append({"start": started, "end": time.perf_counter(), "cpu_s": time.thread_time() - cpu})

    checkpointer.save, checkpointer._write = timed_save, timed_write
    argv = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    status = train.main(argv)
    if status != 0:
        sys.exit(status)
    out_dir = Path(args.out_dir)
    stalls = {}
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "ckpt_stall_s" in record:
            stalls[record["step"]] = record["ckpt_stall_s"]
    for record, done in zip(saves, writes, strict=False):  # one write per save, in order
        record.update(write_start=done["start"], write_end=done["end"], writer_cpu_s=done["cpu_s"])
        record["ckpt_stall_s"] = stalls.get(record["step"])
    emit({"times": clock.times, "saves": saves})


def analyse(
    times: list[float], saves: list[dict[str, Any]], warmup: int, tail: int, neighbours: int = 10
) -> dict[str, Any]:
    """Per measured save: its stall (a), the synchronous save (b), and the ratio; see the docstring.

    times[n - 1] is the end of optimizer step n; step n's interval is (times[n - 2], times[n - 1]].
    A save's steps are compared with the median of the `neighbours` quiet steps (no save, no
    write) nearest to them, so that a drift of the machine's other load cancels out.
    """
    steps = {n: (times[n - 2], times[n - 1]) for n in range(max(2, warmup + 1), len(times) + 1)}
    claimed: dict[int, int] = {}  # step -> the save whose stall it counts in
    measured = [s for s in saves if "sync_total_s" in s and "write_end" in s]
    skipped = []
    for k, s in enumerate(measured):
        touched = [n for n, (a, b) in steps.items() if b > s["start"] and a < s["write_end"]]
        if not touched or touched[-1] + tail > len(times):
            skipped.append({"step": s["step"], "why": "the run ended before its write and tail did"})
            continue
        for n in range(touched[0], touched[-1] + tail + 1):
            claimed.setdefault(n, k)
    quiet = {n: b - a for n, (a, b) in steps.items() if n not in claimed}
    if not quiet:
        raise RuntimeError("no step without a save or a write to take the step time from")
    rows = []
    for k, s in enumerate(measured):
        mine = [n for n, owner in claimed.items() if owner == k]
        if not mine:
            continue
        nearest = sorted(quiet, key=lambda n: min(abs(n - m) for m in mine))[:neighbours]
        base = statistics.median(quiet[n] for n in nearest)
        extra = sum(steps[n][1] - steps[n][0] for n in mine) - s["sync_total_s"] - len(mine) * base
        in_save = s["end"] - s["start"]
        rows.append(
            {
                "step": s["step"],
                "stall_s": extra,
                "in_save_s": in_save,
                "during_write_s": extra - in_save,
                "sync_save_s": s["sync_save_s"],
                "ratio": extra / s["sync_save_s"],
                "steps_counted": len(mine),
                "step_s": base,
                "write_s": s["write_end"] - s["write_start"],
                "writer_cpu_s": s["writer_cpu_s"],
                "ckpt_stall_s": s.get("ckpt_stall_s"),
            }
        )
    step_s = statistics.median(quiet.values())
    return {"step_s": step_s, "quiet_steps": len(quiet), "saves": rows, "skipped": skipped}


@contextlib.contextmanager
def background_load(name: str, work: Path, cores: int) -> Iterator[int]:
    """Start the processes of load `name` for a machine of `cores` beside the training; stop
    them on exit.

    Yields how many were started."""
    per_core, disk = LOADS[name]
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([sys.executable, "-c", SPIN], **quiet) for _ in range(per_core * cores)]
    if disk:
        procs.append(
            subprocess.Popen([sys.executable, "-c", DISK_WRITER, str(work / "disk-load.bin")], **quiet)
        )
    try:
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        (work / "disk-load.bin").unlink(missing_ok=True)


def summarize(analysis: dict[str, Any]) -> dict[str, Any]:
    rows = analysis["saves"]

    def med(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    total_sync = sum(r["sync_save_s"] for r in rows)
    return {
        "saves": len(rows),
        "step_s": analysis["step_s"],
        "ratio_median": med("ratio"),
        "ratio_of_sums": sum(r["stall_s"] for r in rows) / total_sync if total_sync else None,
        **{f"{key}_median": med(key) for key in ("stall_s", "in_save_s", "during_write_s", "sync_save_s")},
        **{f"{key}_median": med(key) for key in ("ckpt_stall_s", "write_s", "writer_cpu_s", "steps_counted")},
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"\nCheckpoint stall, {report['workload']['params'] / 1e6:.1f} M parameters, a save every"
        f" {report['ckpt_every']} steps, {report['threads']} threads; medians over saves"
        f" (machine load average before: {report['loadavg_before']:.2f})"
    )
    head = (
        f"{'load':<7}{'loadavg':>8}{'others':>8}{'step s':>8}{'a: stall':>10}{'in save':>9}"
        f"{'in write':>10}{'b: sync':>9}{'a/b':>7}{'sum a/b':>8}{'ckpt_stall_s':>13}{'write s':>9}"
        f"{'writer cpu':>11}{'saves':>6}"
    )
    print(head)
    for r in report["runs"]:
        if "error" in r:
            print(f"{r['load']:<7}error: {r['error']}")
            continue
        s = r["summary"]
        print(
            f"{r['load']:<7}{r['loadavg_1min']:>8.2f}{fmt(pct(r.get('foreign_cpu')), '.0f'):>7}%"
            f"{s['step_s']:>8.3f}{fmt(s['stall_s_median'], '.3f'):>10}{fmt(s['in_save_s_median'], '.3f'):>9}"
            f"{fmt(s['during_write_s_median'], '.3f'):>10}{fmt(s['sync_save_s_median'], '.3f'):>9}"
            f"{fmt(s['ratio_median'], '.2f'):>7}{fmt(s['ratio_of_sums'], '.2f'):>8}"
            f"{fmt(s['ckpt_stall_s_median'], '.3f'):>13}{fmt(s['write_s_median'], '.2f'):>9}"
            f"{fmt(s['writer_cpu_s_median'], '.2f'):>11}{s['saves']:>6}"
        )
    print(
        "a: extra seconds of the steps from a save to the end of its write (+ tail), over the median"
        " step; in save: inside Checkpointer.save; in write: the steps' slowdown while the thread"
        " writes; b: torch.save + fsync of the same state in the same process; others: share of"
        " the cores used by processes other than the trainer (the load's included)."
    )
    for t in report["targets"]:
        print(f"[{'ok' if t['ok'] else 'MISSED'}] {t['target']}: {t['value']:.2f}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.ckpt", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    p.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated subset of {', '.join(LOADS)}")
    p.add_argument("--rounds", type=int, default=1, help="runs per load, interleaved (default 1)")
    p.add_argument("--saves", type=int, default=5, help="measured saves per run (default 5)")
    p.add_argument("--ckpt-every", type=int, default=10, help="steps between saves (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the step time (default 2)")
    p.add_argument("--tail", type=int, default=1, help="steps after a write counted in its stall (default 1)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP_NUM_THREADS (default: cores)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores the loads are sized for")
    p.add_argument("--settle", type=float, default=2.0, help="seconds a load runs before the training")
    p.add_argument("--tiny", action="store_true", help="tiny model (a smoke test of the harness)")
    p.add_argument(
        "--project",
        type=Path,
        help=f"a project already rendered with package {PACKAGE} instead of the working tree's template"
        " (to measure an edit of its checkpoint.py before it goes into the template)",
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--json", type=Path, help="results file (default bench/results/ckpt-DATE.json)")
    p.add_argument("trainer_args", nargs="*", help=argparse.SUPPRESS)
    return p


def run_load(
    load: str, rnd: int, args: argparse.Namespace, w: Workload, env: dict[str, str], work: Path
) -> dict[str, Any]:
    """One trainer run beside load `load`: its timings, analysed."""
    out_dir = work / f"run-{rnd}-{load}"
    flags = [*run_flags(w, args.ckpt_every, args.saves), f"--out-dir={out_dir}"]
    cmd = [sys.executable, "-m", "bench.ckpt", "--worker", f"--out-dir={out_dir}", "--", *flags]
    with background_load(load, work, args.cores) as started:
        time.sleep(args.settle if started else 0)
        record = run_one(cmd, env, args.timeout)
        loadavg = os.getloadavg()[0]
    shutil.rmtree(out_dir, ignore_errors=True)
    run = {"load": load, "round": rnd, "loadavg_1min": loadavg, "load_processes": started}
    run.update(record)  # the raw timings too (times, saves): the analysis can be redone from the JSON
    head = f"round {rnd + 1}/{args.rounds} {load:<6}"
    if "error" in record:
        print(f"{head} {record['error']}", flush=True)
        return run
    analysis = analyse(record["times"], record["saves"], args.warmup, args.tail)
    run.update(analysis=analysis, summary=summarize(analysis))
    s = run["summary"]
    print(
        f"{head} a/b {fmt(s['ratio_median'], '.2f')} (stall {fmt(s['stall_s_median'], '.3f')} s,"
        f" sync save {fmt(s['sync_save_s_median'], '.3f')} s, step {s['step_s']:.3f} s),"
        f" load average {loadavg:.2f}, others {fmt(pct(record.get('foreign_cpu')), '.0f')}% of the cores,"
        f" {record['wall_s']:.0f} s",
        flush=True,
    )
    return run


def targets(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's target per load it names: the worst run's median ratio."""
    out = []
    for load in TARGET_LOADS:
        ratios = [r["summary"]["ratio_median"] for r in runs if r["load"] == load and "summary" in r]
        ratios = [x for x in ratios if x is not None]
        if ratios:
            worst = max(ratios)
            target = f"{load}: stall / synchronous save <= {TARGET_RATIO}"
            out.append({"target": target, "value": worst, "ok": worst <= TARGET_RATIO})
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    loads = args.loads.split(",")
    unknown = set(loads) - set(LOADS)
    if unknown:
        raise SystemExit(f"--loads: unknown {', '.join(sorted(unknown))}; choose from {', '.join(LOADS)}")
    w = workload(args.tiny)
    report: dict[str, Any] = {
        **stamp("python -m bench.ckpt", argv),
        **git_state(),
        "workload": {**asdict(w), "params": w.params()},
        "ckpt_every": args.ckpt_every,
        "threads": args.threads,
        "loadavg_before": os.getloadavg()[0],
        "project": str(args.project) if args.project else "rendered from the working tree",
        "runs": [],
    }
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        project = args.project or work / "project"
        if args.project is None:
            render(project, PACKAGE)
        # glibc's own malloc (not harness.PIN_MALLOC): the copies a save makes behave as in a user's run.
        env = environment(args.threads, project, pin_malloc=False)
        for rnd in range(args.rounds):
            for load in loads:
                report["runs"].append(run_load(load, rnd, args, w, env, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["targets"] = targets(report["runs"])
    print_report(report)
    path = save_results("ckpt", report, args.json)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
