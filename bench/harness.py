"""The machinery shared by `python -m bench` and `python -m bench.gpu`.

A contender run is one torchrun launch (world size 1 or 2) that prints one result line
(bench.timing). `run_rounds` runs every contender once per round, in the same order every
round (A B C ... A B C ...), so slow drifts of the machine hit all contenders alike, and
`summarize` reports medians and medians of per-round ratios. Each run also records how busy
the machine was with other work while it ran (`foreign_cpu`: CPU time of processes that are
not ours, as a share of all cores), so noisy runs can be spotted, waited out or repeated.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .generated import REPO, render
from .timing import parse

PACKAGE = "benchproj"  # the package name of the rendered project
# The contenders that need a package of the optional `bench` extra: contender -> module.
OPTIONAL = {"accelerate": "accelerate", "fabric": "lightning"}


@dataclass
class Workload:
    task: str = "classifier"  # or "lm": the project's language model (the fields below)
    input_dim: int = 256
    hidden_dim: int = 1024
    depth: int = 3
    num_classes: int = 10
    batch_size: int = 32  # per rank per micro-step
    grad_accum_steps: int = 4
    num_samples: int = 8192
    warmup: int = 10  # optimizer steps excluded from timing
    timed: int = 100  # optimizer steps timed; 100 holds one default eval + checkpoint
    seed: int = 0
    device: str = "cpu"
    precision: str = "fp32"
    num_workers: int = 0
    # The lm task: a GPT of n_layer blocks on windows of seq_len bytes of the text at data_path
    # (batch_size counts windows). The token dir is the generated trainer's cache.
    seq_len: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0  # --dropout of the trainer and the lm loops
    data_path: str = ""
    token_dir: str = ""

    @property
    def max_steps(self) -> int:
        return self.warmup + self.timed + 1  # the last step (final eval + checkpoint) is untimed

    def params(self) -> int:
        """Parameters of the MLP (depth hidden Linear layers and the output layer), or the GPT."""
        if self.task == "lm":  # per block 12 d^2 + 13 d; embeddings (tied head); final norm
            d = self.d_model
            return self.n_layer * (12 * d * d + 13 * d) + (256 + self.seq_len) * d + 2 * d
        dims = [self.input_dim] + [self.hidden_dim] * self.depth + [self.num_classes]
        return sum(a * b + b for a, b in zip(dims, dims[1:], strict=False))

    def flops_per_sample(self) -> float:
        """Training FLOPs per sample: 6 N for the MLP; for the GPT, per token 6 N (position
        embedding excluded) + 12 n_layer d_model seq_len, as the generated model counts them."""
        if self.task != "lm":
            return 6 * self.params()
        n = self.params() - self.seq_len * self.d_model
        return (6 * n + 12 * self.n_layer * self.d_model * self.seq_len) * self.seq_len

    def task_flags(self) -> list[str]:
        """The flags that shape the data and the model, common to every contender."""
        if self.task == "lm":
            return [
                f"--data-path={self.data_path}",
                f"--seq-len={self.seq_len}",
                f"--n-layer={self.n_layer}",
                f"--n-head={self.n_head}",
                f"--d-model={self.d_model}",
                f"--dropout={self.dropout}",
            ]
        return [
            f"--num-samples={self.num_samples}",
            f"--input-dim={self.input_dim}",
            f"--hidden-dim={self.hidden_dim}",
            f"--depth={self.depth}",
            f"--num-classes={self.num_classes}",
        ]

    def common_flags(self) -> list[str]:
        return [
            *self.task_flags(),
            f"--batch-size={self.batch_size}",
            f"--grad-accum-steps={self.grad_accum_steps}",
            f"--max-steps={self.max_steps}",
            f"--seed={self.seed}",
            f"--device={self.device}",
            f"--precision={self.precision}",
            f"--num-workers={self.num_workers}",
        ]


def lm_data(project: Path, work: Path, seq_len: int, windows: int) -> dict[str, str]:
    """Write the rendered lm project's shipped text to work/text.txt, repeated and cut to the
    length that gives exactly `windows` training windows of seq_len + 1 bytes once the trainer
    holds out its last 10 % (--val-fraction 0.1), so that an epoch splits into full optimizer
    steps when windows divides by the global batch. Returns the Workload fields for it."""
    corpus = (project / "src" / PACKAGE / "engine" / "corpus.txt").read_bytes()
    length = int((windows * seq_len + 1) / 0.9) + 1
    while (int(length * 0.9) - 1) // seq_len != windows:
        length += 1
    path = work / "text.txt"
    path.write_bytes((corpus * (length // len(corpus) + 1))[:length])
    return {"data_path": str(path), "token_dir": str(work / "tokens")}


def installed(contender: str) -> bool:
    """Whether the package a contender needs, if any, can be imported."""
    module = OPTIONAL.get(contender)
    return module is None or importlib.util.find_spec(module) is not None


def torchrun(world_size: int, module: str, args: list[str]) -> list[str]:
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*run, f"--nproc-per-node={world_size}", "-m", module, *args]


# The generated trainer's variants: the flags each adds to the bench's defaults.
GENERATED_VARIANTS = {
    "generated": [],
    # Evaluation only at the (untimed) last step.
    "generated-noeval": ["--eval-every=0"],
    # Nothing inside the window: logging, evaluation and checkpoints only at the last step.
    "generated-quiet": [
        "--log-every=1000000000",
        "--ckpt-every=0",
        "--eval-every=0",
        "--ckpt-every-minutes=0",
    ],
    "generated-compile": ["--compile"],  # bench.gpu, when the trainer has the flag
    "generated-workers2": ["--num-workers=2"],  # the data-wait runs of python -m bench
}


def trainer_flags(w: Workload) -> list[str]:
    """The generated trainer's flags on workload `w`, at its default intervals but one.

    The trainer saves every 1000 steps or 30 minutes by default; the bench saves once in its
    100-step window (a harsher case), so the window holds a checkpoint as well as an eval.
    """
    flags = [*w.common_flags(), "--resume=never", "--ckpt-every=100"]
    return flags + ([f"--token-dir={w.token_dir}"] if w.task == "lm" else [])


def command(contender: str, world_size: int, w: Workload, out_dir: Path) -> list[str]:
    """The launch command of one contender run."""
    if not contender.startswith("generated"):
        timing = [f"--warmup={w.warmup}", f"--timed={w.timed}"]
        module = "bench.lm_loop" if w.task == "lm" else "bench.loops"
        return torchrun(world_size, module, [f"--contender={contender}", *w.common_flags(), *timing])
    trainer = [*trainer_flags(w), *GENERATED_VARIANTS[contender]]  # the later flag wins
    runner = [
        f"--package={PACKAGE}",
        f"--label={contender}",
        f"--warmup={w.warmup}",
        f"--timed={w.timed}",
        f"--global-batch={w.batch_size * w.grad_accum_steps * world_size}",
        f"--out-dir={out_dir}",
        "--",
        *trainer,
    ]
    return torchrun(world_size, "bench.generated", runner)


def _busy_seconds() -> float | None:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _our_seconds() -> float:
    """CPU seconds of this process and its finished children (torchrun and its workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def foreign_load(seconds: float) -> float | None:
    """Share of all cores used by other processes during the next `seconds` (we stay idle)."""
    busy0, ours0 = _busy_seconds(), _our_seconds()
    time.sleep(seconds)
    busy1, ours1 = _busy_seconds(), _our_seconds()
    if busy0 is None or busy1 is None:
        return None
    return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (seconds * (os.cpu_count() or 1))


def wait_quiet(max_wait: float, threshold: float = 0.1) -> float:
    """Wait (at most max_wait s) for a second in which other processes use < threshold of the cores."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_wait:
        load = foreign_load(1.0)
        if load is None or load < threshold:
            break
    return time.perf_counter() - started


def first_exception(stderr: str) -> str | None:
    """The first `SomeError: message` line of a failed launch: a worker's exception, where the
    last lines are torchrun's summary of the failure."""
    raised = re.search(r"^\w[\w.]*(Error|Exception): .*$", stderr, re.MULTILINE)
    return raised.group(0) if raised else None


def run_one(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one contender; its result line plus wall time, exit status and foreign load."""
    busy0, ours0 = _busy_seconds(), _our_seconds()
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - started
    busy1, ours1 = _busy_seconds(), _our_seconds()
    record: dict[str, Any] = {"exit_status": done.returncode, "wall_s": wall}
    if busy0 is not None and busy1 is not None:
        foreign = max(0.0, (busy1 - busy0) - (ours1 - ours0))
        record["foreign_cpu"] = foreign / (wall * (os.cpu_count() or 1))
    result = parse(done.stdout)
    if result is None:
        lines = done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"]
        reason = first_exception(done.stderr) or lines[-1]
        record["error"] = f"exit {done.returncode}, no result: {reason[-300:]}"
        record["stderr_tail"] = done.stderr[-3000:]
    else:
        record.update(result)
        if done.returncode != 0:  # e.g. a teardown abort after the result was printed
            record["warning"] = f"exit status {done.returncode} after the result line"
    return record


def run_rounds(
    contenders: list[str],
    world_sizes: list[int],
    repeats: int,
    w: Workload,
    env: dict[str, str],
    work: Path,
    timeout: float = 600,
    wait_quiet_s: float = 0.0,
    retry_above: float | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Interleaved runs: for each round, each world size, each contender in order.

    wait_quiet_s: before each run, wait up to this long for the machine to be idle.
    retry_above: rerun (once) a run during which other processes used more than this share
    of the cores, and keep the run with less foreign load.
    """
    runs = []
    for rnd in range(repeats):
        for ws in world_sizes:
            for c in contenders:
                out_dir = work / f"run-{rnd}-{ws}-{c}"
                waited = wait_quiet(wait_quiet_s) if wait_quiet_s > 0 else 0.0
                record = run_one(command(c, ws, w, out_dir), env, timeout)
                foreign = record.get("foreign_cpu")
                if retry_above is not None and foreign is not None and foreign > retry_above:
                    log(f"  (other processes used {100 * foreign:.0f}% of the cores; running it again)")
                    waited += wait_quiet(wait_quiet_s) if wait_quiet_s > 0 else 0.0
                    _rmtree(out_dir)  # a run owns its --out-dir: --resume never refuses a used one
                    again = run_one(command(c, ws, w, out_dir), env, timeout)
                    if "error" not in again and again.get("foreign_cpu", 1.0) < foreign:
                        record = again
                record.update(round=rnd, world_size=ws, contender=c, waited_s=waited)
                runs.append(record)
                _rmtree(out_dir)
                problem = "  " + record["error"] if "error" in record else ""
                load = record.get("foreign_cpu")
                log(
                    f"round {rnd + 1}/{repeats} W={ws} {c:<18}"
                    f"{fmt(record.get('samples_per_sec'), ',.0f'):>9} samples/s"
                    f"  ({record.get('wall_s', 0):.1f} s, other load {fmt(pct(load), '.0f')}%,"
                    f" {fmt(record.get('page_faults_per_step'), '.0f')} page faults/step){problem}"
                )
    return runs


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def sps(
    runs: list[dict[str, Any]], contender: str, ws: int, rnd: int, key: str = "samples_per_sec"
) -> float | None:
    for r in runs:
        if (r["contender"], r["world_size"], r["round"]) == (contender, ws, rnd) and "error" not in r:
            return r.get(key)
    return None


def runs_of(runs: list[dict[str, Any]], contender: str, ws: int) -> list[dict[str, Any]]:
    return [r for r in runs if (r["contender"], r["world_size"]) == (contender, ws) and "error" not in r]


def ratios(runs: list[dict[str, Any]], a: str, b: str, ws: int, key: str = "samples_per_sec") -> list[float]:
    """a / b for every round in which both ran at world size ws."""
    rounds = sorted({r["round"] for r in runs})
    pairs = [(sps(runs, a, ws, rnd, key), sps(runs, b, ws, rnd, key)) for rnd in rounds]
    return [x / y for x, y in pairs if x and y]


def summarize(
    runs: list[dict[str, Any]],
    contenders: list[str],
    world_sizes: list[int],
    key: str = "samples_per_sec",
    base: str = "reference",
) -> dict[str, Any]:
    """Medians per contender and world size, and medians of per-round ratios to `base` (the
    "reference" of the fields' names), of `key` (samples_per_sec: wall time;
    cpu_samples_per_sec: rank 0's CPU time, see bench.timing)."""
    rounds = sorted({r["round"] for r in runs})
    table: dict[str, Any] = {}
    for ws in world_sizes:
        rows = {}
        for c in contenders:
            values = [v for v in (sps(runs, c, ws, rnd, key) for rnd in rounds) if v]
            ref_ratios = ratios(runs, c, base, ws, key)
            rows[c] = {
                "median_samples_per_sec": median_or_none(values),
                "min": min(values) if values else None,
                "max": max(values) if values else None,
                "n": len(values),
                "median_ratio_to_reference": median_or_none(ref_ratios),
                "ratios_to_reference": ref_ratios,
                "median_page_faults_per_step": median_or_none(
                    [r["page_faults_per_step"] for r in runs_of(runs, c, ws) if "page_faults_per_step" in r]
                ),
            }
        ours = [r for r in runs if r["world_size"] == ws and r["contender"] in contenders]
        data_wait = [r.get("self_data_wait_frac_median") for r in ours if r["contender"] == "generated"]
        data_wait = [x for x in data_wait if x is not None]
        overheads = [100 * (1 - x) for x in ratios(runs, "generated", "generated-quiet", ws, key)]
        log_ckpt = [100 * (1 - x) for x in ratios(runs, "generated-noeval", "generated-quiet", ws, key)]
        evals = [100 * (1 - x) for x in ratios(runs, "generated", "generated-noeval", ws, key)]
        gen_runs = runs_of(runs, "generated", ws)

        def inrun(group: str, gen_runs: list[dict[str, Any]] = gen_runs) -> float | None:
            key = f"inrun_overhead_pct_{group}"
            return median_or_none([r[key] for r in gen_runs if key in r])

        table[str(ws)] = {
            "reference": base,
            "contenders": rows,
            # Measured inside the generated runs (bench.generated.time_side_work): the reliable figures.
            "inrun_overhead_pct_log_ckpt": inrun("log_ckpt"),
            "inrun_overhead_pct_log": inrun("log"),
            "inrun_overhead_pct_checkpoint": inrun("checkpoint"),
            "inrun_overhead_pct_eval": inrun("eval"),
            "overhead_pct_defaults_vs_quiet": median_or_none(overheads),
            "overheads_pct": overheads,
            "overhead_pct_log_ckpt": median_or_none(log_ckpt),  # generated-noeval vs generated-quiet
            "overhead_pct_eval": median_or_none(evals),  # generated vs generated-noeval
            "no_sync_gain": median_or_none(ratios(runs, "reference", "allreduce", ws, key)),
            "generated_vs": {
                other: median_or_none(ratios(runs, "generated", other, ws, key))
                for other in ("accelerate", "fabric")
                if other in contenders
            },
            "data_wait_frac_workers0": median_or_none(data_wait),
            "foreign_cpu_median": median_or_none([r["foreign_cpu"] for r in ours if "foreign_cpu" in r]),
        }
    return table


def run_worker(module: str, argv: list[str], data: dict[str, str] | None = None, world_size: int = 1) -> Any:
    """Render a project (answers `data`), run `python -m module --worker argv` in its environment
    (one thread per process; under torchrun with W > 1) and return the JSON of its last output
    line, or None after printing the end of its stderr when it failed."""
    work = Path(tempfile.mkdtemp(prefix=f"{module.replace('.', '-')}-"))
    try:
        project = work / "project"
        render(project, PACKAGE, data=data)
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launch += [f"--nproc-per-node={world_size}", "-m"] if world_size > 1 else ["-m"]
        cmd = [*launch, module, "--worker", *argv]
        env = environment(1, project)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.getcwd())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def save_results(kind: str, data: Any, path: Path | None = None) -> Path:
    """Write a command's results as JSON: to `path`, or to bench/results/KIND-DATE.json."""
    path = path or REPO / "bench" / "results" / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def stamp(prog: str, argv: list[str] | None) -> dict[str, Any]:
    """What heads every results file: when, the command line, and the versions that matter."""
    versions = {"python": platform.python_version()}
    for dist_name in ("torch", "accelerate", "lightning", "copier"):
        try:
            versions[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([prog, *(argv if argv is not None else sys.argv[1:])]),
        "versions": versions,
    }


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "copier.yml", "template", "bench"))
    return {"commit": git("rev-parse", "HEAD"), "template_or_bench_modified": dirty}


# glibc serves allocations >= its mmap threshold (128 KiB at start) with mmap, and raises the
# threshold the first time such a block is freed. Whether that happened during a process's
# set-up decides whether every 128 KiB activation and 4 MiB gradient of this workload is faulted
# in afresh each step (thousands of page faults per step, ~15 % slower) or reused from the
# heap: a per-process lottery measured here, unrelated to the loop being compared. Fixing both
# thresholds (32 MiB is glibc's maximum) gives every contender the same, lucky, allocator.
PIN_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def environment(threads: int, project: Path, pin_malloc: bool = True) -> dict[str, str]:
    """The contenders' environment: threads per process, and both the repo and the project importable."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(project / "src")]),
        "PYTHONUNBUFFERED": "1",
    }
    if pin_malloc:
        env.update(PIN_MALLOC)
    return env
