"""Render a project from this repository's working tree, and run its trainer under the bench clock.

    python -m bench.generated --package demo --warmup 10 --timed 100 -- --max-steps 111 ...

runs `demo.train.main(argv)` unmodified, with bench.timing's StepClock installed, and prints the
result line on rank 0: throughput measured exactly as for the hand-written loops, plus what the
trainer itself wrote to OUT_DIR/metrics.jsonl over the timed steps (its own samples/s, which
leaves out logging and checkpoint time, and the share of step time spent waiting for data).
The project must be importable: PYTHONPATH=<project>/src.

It also times, inside the same run, the trainer's calls that are not training (the entries of
TRAINER_CALLS with a group: metrics, checkpoints and evaluation). Their seconds
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
from typing import Any, NamedTuple

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


class TrainerCall(NamedTuple):
    """A function or method of the generated package that the bench wraps with a timer."""

    owner: str  # a module of the package (engine.dist), or module.Class (engine.dist.AgreeLater)
    attr: str
    label: str  # its line in `python -m bench.profile`
    group: str | None = None  # its overhead group in `python -m bench`; None: training itself
    data_wait_from_result: bool = False  # returns (loss, seconds waiting for data)


# The trainer's calls the bench times, looked up by name in the rendered package: train.py calls
# them through their modules and classes, so the wrappers are what it calls. A name the template
# no longer has stops the run (trainer_call_owner), so that a rename cannot drop a timer unseen.
TRAINER_CALLS = (
    TrainerCall(
        "step", "forward_backward", "forward+backward (incl. DDP all-reduce)", data_wait_from_result=True
    ),
    TrainerCall("engine.dist.AgreeLater", "start", "flags: start the background all-reduce"),
    TrainerCall("engine.dist.AgreeLater", "result", "flags: collect the previous step's all-reduce"),
    TrainerCall("engine.metrics", "reduce_metrics", "metrics: reduce_metrics (collectives)", "log"),
    TrainerCall("engine.metrics.Logger", "log", "metrics: write + print", "log"),
    # Builds the checkpoint's state (a collective); Checkpointer.save calls it itself, and
    # Timers counts a nested call once.
    TrainerCall("engine.state.TrainState", "state_dict", "checkpoint: TrainState.state_dict", "checkpoint"),
    TrainerCall(
        "engine.checkpoint.Checkpointer",
        "save",
        "checkpoint: save (stall; the write is a thread)",
        "checkpoint",
    ),
    TrainerCall("train", "evaluate", "evaluate", "eval"),
)
GROUPS = ("log", "checkpoint", "eval")


def trainer_call_owner(package: str, call: TrainerCall) -> Any:
    """The module or class of the rendered package that holds `call.attr`."""
    module_name, _, cls = call.owner.rpartition(".")
    if not cls[:1].isupper():  # a module, not a class
        module_name, cls = call.owner, ""
    owner: Any = importlib.import_module(f"{package}.{module_name}")
    if cls:
        owner = getattr(owner, cls, None)
    if not hasattr(owner, call.attr):
        raise RuntimeError(
            f"{package}.{call.owner}.{call.attr} does not exist: the template renamed or removed it;"
            " update bench.generated.TRAINER_CALLS"
        )
    return owner


def time_side_work(package: str, timers: Timers) -> None:
    """Wrap the trainer's logging, checkpoint and evaluation calls with the window's timers,
    one timer per group."""
    for call in TRAINER_CALLS:
        if call.group is not None:
            timers.wrap(trainer_call_owner(package, call), call.attr, call.group)


def side_work_overhead_pct(timers: Timers, window_s: float) -> dict[str, float]:
    """Per group: 100 x its seconds inside the timed window / the window's other seconds."""
    other = window_s - sum(timers.seconds.values())
    out = {group: 100 * timers.seconds[group] / other for group in GROUPS}
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
    timers = Timers(clock)
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
