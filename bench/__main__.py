"""Is the generated trainer as fast as a hand-written DDP loop, Accelerate and Fabric?

    python -m bench                 # the full comparison, about 8-10 minutes on 2 idle CPU cores
    python -m bench --quick         # one round, shorter window: about 2-3 minutes
    python -m bench --repeats 5     # more rounds, tighter medians
    python -m bench --wait-quiet 30 # on a shared machine: start each run when the cores are idle
    python -m bench --workload lm   # the language-model task: its GPT vs a hand-written loop on it

Renders a project from this repository's working tree with the real CLI, then runs every
contender on the same workload (MLP 256-1024x3-10, per-rank batch 32, 4 accumulation
micro-steps, AdamW, fp32, CPU, gloo) at world sizes 1 and 2 under torchrun, interleaved
(A B C ... A B C ...). Reports median global samples/s per contender and world size, the
median of per-round ratios to the hand-written reference-same-work, the generated trainer's logging and
checkpointing overhead, the no_sync gain and its data-wait share.
With --workload lm the project is rendered with task=lm and the model is its GPT (4 blocks,
width 128, 4 heads, windows of 64 bytes, per-rank batch 8 windows, 4 micro-steps) on 36 KB of
its shipped text: exactly 512 training windows, so every epoch splits into full steps at W=1
and W=2; the hand-written contenders (bench/lm_loop.py) train the same GPT class.
See bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .generated import render
from .harness import (
    OPTIONAL,
    PACKAGE,
    Workload,
    command,
    environment,
    fmt,
    git_state,
    installed,
    lm_data,
    pct,
    run_one,
    run_rounds,
    save_results,
    stamp,
    summarize,
)

DESCRIPTIONS = {  # every contender, in the order of a round
    "reference-same-work": "hand-written DDP loop doing the trainer's work: fused AdamW, clipping, LR"
    " schedule, non-finite skip (bench/loops.py); the base of the ratios and targets",
    "reference": "hand-written DDP loop, no_sync accumulation, for-loop AdamW, no clip/schedule",
    "reference-fused": "the reference with AdamW(fused=True), as the generated trainer uses on CPU",
    "generated": "generated trainer, defaults: log every 10, eval + checkpoint every 100",
    "generated-noeval": "generated trainer, defaults but no evaluation inside the window",
    "generated-quiet": "generated trainer, no logging/eval/checkpoint inside the window",
    "allreduce": "hand-written DDP loop, all-reduce on every micro-step",
    "accelerate": "Hugging Face Accelerate, accumulate()",
    "fabric": 'Lightning Fabric, strategy="ddp", no_backward_sync()',
}
ALL_CONTENDERS = tuple(DESCRIPTIONS)
LM_CONTENDERS = (
    "reference-same-work", "reference", "generated", "generated-noeval", "generated-quiet", "allreduce"
)  # fmt: skip
LM_DESCRIPTIONS = {
    "reference-same-work": "hand-written DDP loop on the project's GPT doing the trainer's work;"
    " with --dropout, SDPA(dropout_p) attention and torch's masks (bench/lm_loop.py)",
    "reference": "hand-written DDP loop on the project's GPT, no_sync, fused AdamW (bench/lm_loop.py)",
    "allreduce": "the same hand-written loop, all-reduce on every micro-step",
}
# The targets: checked and printed on every run, never asserted in tests. Ratios are to
# reference-same-work when it runs (to reference otherwise): the same work, done by hand.
TARGETS_VS_BASE = {"generated": 0.98, "generated-quiet": 1.00}
TARGET_OVERHEAD_PCT = 3.0


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out = []

    def add(target: str, value: float | None, ok: bool) -> None:
        if value is not None:
            out.append({"target": target, "value": value, "ok": ok})

    for ws, s in summary.items():
        for contender, least in TARGETS_VS_BASE.items():
            ratio = s["contenders"].get(contender, {}).get("median_ratio_to_reference")
            add(
                f"W={ws}: {contender} / {s['reference']} >= {least}",
                ratio,
                ratio is not None and ratio >= least,
            )
        for other, ratio in s["generated_vs"].items():
            add(f"W={ws}: generated / {other} >= 1", ratio, ratio is not None and ratio >= 1)
        overhead = s["inrun_overhead_pct_log_ckpt"]  # measured inside the runs: see bench.generated
        ok = overhead is not None and overhead <= TARGET_OVERHEAD_PCT
        add(f"W={ws}: logging+checkpointing overhead at defaults <= {TARGET_OVERHEAD_PCT}% ", overhead, ok)
    return out


def print_table(title: str, summary: dict[str, Any], contenders: list[str]) -> None:
    print(title)
    header = f"{'contender':<20}"
    for ws in summary:
        header += f"{'W=' + ws + ' samples/s':>17}{'x ref':>7}"
    print(header)
    for c in contenders:
        line = f"{c:<20}"
        for s in summary.values():
            row = s["contenders"][c]
            line += f"{fmt(row['median_samples_per_sec'], ',.0f'):>17}"
            line += f"{fmt(row['median_ratio_to_reference'], '.3f'):>7}"
        print(line)


def print_report(result: dict[str, Any]) -> None:
    summary, contenders = result["summary"], result["contenders"]
    lm = result["workload"]["task"] == "lm"
    note = "Samples are windows of seq_len tokens: tokens/s = samples/s x seq_len. " if lm else ""
    print()
    print_table(
        note + f"Global samples/s (wall clock): median of {result['repeats']} interleaved rounds;"
        f" x ref: median of per-round ratios to {next(iter(summary.values()))['reference']}."
        f" OMP_NUM_THREADS={result['threads_per_process']} per process.",
        summary,
        contenders,
    )
    print()
    print_table(
        "The same, per rank-0 CPU second instead of wall second (robust to other load; blind to waits):",
        result["summary_cpu"],
        contenders,
    )
    for c, why in result["skipped"].items():
        print(f"{c:<20}skipped: {why}")
    print()
    for ws, s in summary.items():  # every round, not only the medians
        for c in contenders:
            ratios = ", ".join(f"{x:.3f}" for x in s["contenders"][c]["ratios_to_reference"])
            print(f"W={ws} {c:<20} per-round x ref (wall): {ratios}")
    print()
    for ws, s in summary.items():
        print(
            f"W={ws}: overhead at defaults, timed inside the generated runs: logging"
            f" {fmt(s['inrun_overhead_pct_log'], '.1f')}% + checkpointing"
            f" {fmt(s['inrun_overhead_pct_checkpoint'], '.1f')}%"
            f" = {fmt(s['inrun_overhead_pct_log_ckpt'], '.1f')}%,"
            f" evaluation {fmt(s['inrun_overhead_pct_eval'], '.1f')}%;"
            f" from separate runs (noisy): logging+checkpointing {fmt(s['overhead_pct_log_ckpt'], '+.1f')}%,"
            f" evaluation {fmt(s['overhead_pct_eval'], '+.1f')}%,"
            f" all three {fmt(s['overhead_pct_defaults_vs_quiet'], '+.1f')}%;"
            f" no_sync gain (reference / allreduce) {fmt(s['no_sync_gain'], '.3f')}x;"
            f" data wait at --num-workers 0: {fmt(pct(s['data_wait_frac_workers0']), '.1f')}% of step time;"
            f" other processes used {fmt(pct(s['foreign_cpu_median']), '.0f')}% of the cores (median)"
        )
    for ws, d in result.get("data_wait", {}).items():
        print(
            f"W={ws}: --num-workers 2: data wait {fmt(pct(d.get('data_wait_frac')), '.1f')}% of step time,"
            f" {fmt(d.get('samples_per_sec'), ',.0f')} samples/s"
            f" ({fmt(d.get('ratio_to_workers0'), '.3f')}x the generated --num-workers 0 median; one run)"
        )
    if result["targets"]:
        print()
        for t in result["targets"]:
            print(f"[{'ok' if t['ok'] else 'MISSED'}] {t['target']}: {t['value']:.3f}")
    for r in result["runs"]:
        if "error" in r or "warning" in r:
            problem = r.get("error") or r["warning"]
            print(f"note: round {r['round'] + 1} W={r['world_size']} {r['contender']}: {problem}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round, 40 timed steps")
    p.add_argument("--repeats", type=int, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--world-sizes", default="1,2", help="comma-separated (default 1,2)")
    p.add_argument("--contenders", default=",".join(ALL_CONTENDERS), help="comma-separated subset")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process (default 1)")
    p.add_argument("--warmup", type=int, help="untimed optimizer steps (default 10; 5 with --quick)")
    p.add_argument("--timed", type=int, help="timed optimizer steps (default 100; 40 with --quick)")
    p.add_argument("--tiny", action="store_true", help="tiny model and data (a smoke test of the harness)")
    p.add_argument("--workload", choices=["mlp", "lm"], default="mlp", help="the task (default mlp)")
    p.add_argument("--dropout", type=float, default=0.0, help="--workload lm: the GPT's --dropout")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S", help="wait <= S s for idle cores")
    p.add_argument(
        "--retry-above", type=float, metavar="F", help="rerun a run once if others used > F of the cores"
    )
    p.add_argument(
        "--no-pin-malloc",
        action="store_true",
        help="leave glibc's adaptive mmap threshold alone (see harness.PIN_MALLOC)",
    )
    p.add_argument("--no-data-wait", action="store_true", help="skip the --num-workers 2 runs")
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--json", type=Path, help="results file (default bench/results/bench-DATE.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    w = Workload(task="lm" if args.workload == "lm" else "classifier")
    if w.task == "lm":
        w.batch_size, w.dropout = 8, args.dropout
        if args.contenders == ",".join(ALL_CONTENDERS):
            args.contenders = ",".join(LM_CONTENDERS)
        DESCRIPTIONS.update(LM_DESCRIPTIONS)
    if args.quick:
        w.warmup, w.timed = 5, 40
    if args.tiny:
        w.input_dim, w.hidden_dim, w.depth, w.num_samples = 16, 32, 1, 1024
        w.n_layer, w.d_model, w.n_head, w.seq_len = 1, 32, 2, 16
    w.warmup = args.warmup if args.warmup is not None else w.warmup
    w.timed = args.timed if args.timed is not None else w.timed
    if w.warmup < 1 or w.timed < 1 or repeats < 1:
        raise SystemExit("--warmup, --timed and --repeats must be at least 1")
    world_sizes = [int(x) for x in args.world_sizes.split(",")]
    contenders, skipped = [], {}
    for c in args.contenders.split(","):
        if c not in ALL_CONTENDERS:
            raise SystemExit(f"unknown contender {c!r}; choose from {', '.join(ALL_CONTENDERS)}")
        if w.task == "lm" and c not in LM_CONTENDERS:
            raise SystemExit(f"{c}: not available for --workload lm; choose from {', '.join(LM_CONTENDERS)}")
        if not installed(c):
            skipped[c] = f"`{OPTIONAL[c]}` is not installed (pip install -e '.[bench]')"
            print(f"notice: skipping {c}: {skipped[c]}", flush=True)
        else:
            contenders.append(c)
    # Ratios and targets are relative to the loop that does the trainer's work by hand.
    base = next((c for c in ("reference-same-work", "reference") if c in contenders), None)
    if base is None:
        raise SystemExit("reference-same-work or reference is needed: ratios are relative to it")
    if w.timed < 100 and "generated" in contenders:
        print(
            f"notice: the window has {w.timed} < 100 steps, so it holds no default eval/checkpoint"
            " (every 100 steps): the overhead figure covers logging only",
            flush=True,
        )

    def log(message: str) -> None:
        print(message, flush=True)

    work = Path(tempfile.mkdtemp(prefix="ddp-bench-"))
    started, git = time.time(), git_state()  # the template is rendered from this state
    try:
        project = work / "project"
        render_s = render(project, PACKAGE, data={"task": w.task})
        if w.task == "lm":  # 512 training windows: every epoch splits into full steps at W=1 and W=2
            w = replace(w, **lm_data(project, work, w.seq_len, 512))
        log(f"rendered the working tree's template in {render_s:.2f} s: {project}")
        env = environment(args.threads, project, pin_malloc=not args.no_pin_malloc)
        load_before = os.getloadavg()
        runs = run_rounds(
            contenders,
            world_sizes,
            repeats,
            w,
            env,
            work,
            timeout=args.timeout,
            wait_quiet_s=args.wait_quiet,
            retry_above=args.retry_above,
            log=log,
        )
        summary = summarize(runs, contenders, world_sizes, base=base)
        summary_cpu = summarize(runs, contenders, world_sizes, key="cpu_samples_per_sec", base=base)
        data_wait: dict[str, Any] = {}
        if not args.no_data_wait and "generated" in contenders:
            for ws in world_sizes:
                record = run_one(
                    command("generated-workers2", ws, w, work / f"workers2-{ws}"), env, args.timeout
                )
                record.update(round=0, world_size=ws, contender="generated-workers2")
                runs.append(record)
                base = summary[str(ws)]["contenders"]["generated"]["median_samples_per_sec"]
                rate = record.get("samples_per_sec")
                data_wait[str(ws)] = {
                    "data_wait_frac": record.get("self_data_wait_frac_median"),
                    "samples_per_sec": rate,
                    "ratio_to_workers0": rate / base if rate and base else None,
                    "foreign_cpu": record.get("foreign_cpu"),
                }
                log(f"W={ws} generated --num-workers 2: {fmt(rate, ',.0f')} samples/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        **stamp("python -m bench", argv),
        "duration_s": time.time() - started,
        "repeats": repeats,
        "world_sizes": world_sizes,
        "threads_per_process": args.threads,
        "malloc_pinned": not args.no_pin_malloc,
        "workload": {**asdict(w), "max_steps": w.max_steps, "params": w.params(), "optimizer": "AdamW"},
        "contenders": contenders,
        "descriptions": {c: DESCRIPTIONS[c] for c in contenders},
        "skipped": skipped,
        "machine": {"cpus": os.cpu_count(), "load_avg_before": load_before},
        "git": git,
        "summary": summary,
        "summary_cpu": summary_cpu,
        "data_wait": data_wait,
        "targets": check_targets(summary),
        "runs": runs,
    }
    path = save_results("bench", result, args.json)
    print_report(result)
    print(f"\nresults: {path}  ({result['duration_s'] / 60:.1f} min)")
    foreign = [s["foreign_cpu_median"] for s in summary.values() if s["foreign_cpu_median"] is not None]
    if foreign and max(foreign) > 0.1:
        print(
            "warning: other processes used a large share of the cores during the runs; absolute"
            " figures are low and noisy. Rerun on an idle machine, or with --wait-quiet 30 --retry-above 0.1."
        )
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
