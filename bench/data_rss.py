"""Peak memory of each rank of the generated trainer on a CSV file larger than the data a rank
should hold: --data-path reads rows through a memory map, so no rank copies the file.

    python -m bench.data_rss                       # a 1 GiB CSV, 2 ranks (~3 min on 2 shared cores)
    python -m bench.data_rss --size-mb 64 --steps 5

Writes a CSV of --size-mb MiB (64 features of 9-10 characters, a label column of 10 classes; a
block of random rows repeated until the size is reached) in a temporary directory, renders the
project from this working tree, and trains it twice with torchrun (--nproc ranks, CPU, gloo):
first with an empty --cache-dir (one rank converts the CSV into the cache, the others wait),
then again on the converted cache. While each run lasts, every rank's /proc/PID/status is read
every 50 ms: its peak resident set (VmHWM, the kernel's high-water mark) and the largest
anonymous (RssAnon: the process's own memory) and file-backed (RssFile: mapped pages of files,
shared by every process that maps them, and dropped first under memory pressure) parts seen.
Prints one line per run and rank, and writes JSON to bench/results/ (or --json).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .generated import render
from .harness import PACKAGE, environment, save_results, stamp, torchrun

STATUS_KEYS = ("VmHWM", "RssAnon", "RssFile")  # kB in /proc/PID/status
BLOCK_ROWS = 10_000  # random rows written once, then repeated


def write_csv(path: Path, size: int, features: int, classes: int, seed: int = 0) -> int:
    """A CSV of at least `size` bytes: a header, then a block of random rows repeated."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BLOCK_ROWS, features)).astype(np.float32)
    labels = rng.integers(0, classes, BLOCK_ROWS)
    lines = [",".join(f"{v:.6e}" for v in row) + f",{label}\n" for row, label in zip(x, labels, strict=True)]
    block = "".join(lines).encode()
    rows = 0
    with open(path, "wb") as file:
        file.write((",".join(f"f{i}" for i in range(features)) + ",label\n").encode())
        while file.tell() < size:
            file.write(block)
            rows += BLOCK_ROWS
    return rows


def children(root: int) -> list[int]:
    """The pids of every process descended from `root`."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rpartition(")")[2].split()[1])
            parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in parents.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def rank_of(pid: int) -> int | None:
    """The RANK torchrun gave a trainer process; None for any other process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    if f"{PACKAGE}.train".encode() not in cmdline:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def memory_of(pid: int) -> dict[str, int] | None:
    """VmHWM, RssAnon and RssFile of a process, in kB; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in STATUS_KEYS:
            values[key] = int(rest.split()[0])
    return values if len(values) == len(STATUS_KEYS) else None


def run_and_watch(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> dict[str, Any]:
    """Run `cmd`, sampling the memory of each rank every 50 ms: the largest value of each key."""
    peaks: dict[int, dict[str, int]] = {}
    started = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if time.monotonic() - started > timeout:
                process.kill()
                raise RuntimeError(f"timed out after {timeout:.0f} s; see {log}")
            for pid in children(process.pid):
                rank = rank_of(pid)
                memory = memory_of(pid) if rank is not None else None
                if memory:
                    peak = peaks.setdefault(rank, dict.fromkeys(STATUS_KEYS, 0))
                    for key, value in memory.items():
                        peak[key] = max(peak[key], value)
            time.sleep(0.05)
    if process.returncode != 0:
        raise RuntimeError(f"exit {process.returncode}:\n{log.read_text()[-3000:]}")
    return {"seconds": time.monotonic() - started, "ranks": dict(sorted(peaks.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.data_rss", description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the CSV file in MiB")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc-per-node)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of each run")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds each run may take")
    parser.add_argument("--json", type=Path, default=None, help="results file (default: bench/results/)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-data-rss-") as tmp:
        work = Path(tmp)
        render(work / "project", PACKAGE)
        csv = work / "data.csv"
        rows = write_csv(csv, args.size_mb << 20, args.features, classes=10)
        size = csv.stat().st_size
        print(f"{csv.name}: {size / 2**20:,.0f} MiB, {rows:,} rows of {args.features} features")
        flags = [
            f"--data-path={csv}", f"--cache-dir={work / 'cache'}", "--device=cpu",
            f"--max-steps={args.steps}", f"--batch-size={args.batch_size}", "--eval-every=0",
            "--ckpt-every=0", "--ckpt-every-minutes=0", f"--log-every={args.steps}",
        ]  # fmt: skip
        env = environment(threads=1, project=work / "project")
        results = []
        for name in ("converts", "cached"):
            out_dir = work / f"run-{name}"
            cmd = torchrun(args.nproc, f"{PACKAGE}.train", [*flags, f"--out-dir={out_dir}"])
            run = run_and_watch(cmd, env, work / f"{name}.log", args.timeout)
            results.append({"run": name, **run})
            for rank, peak in run["ranks"].items():
                mib = {key: value / 1024 for key, value in peak.items()}
                print(
                    f"{name:8s} rank {rank}: peak RSS {mib['VmHWM']:7.0f} MiB"
                    f" (anonymous {mib['RssAnon']:5.0f} MiB, file-backed {mib['RssFile']:5.0f} MiB)"
                    f" in {run['seconds']:.0f} s"
                )
        cache = sum(f.stat().st_size for f in (work / "cache").rglob("*") if f.is_file())
        print(f"file {size / 2**20:,.0f} MiB; its cache (float32, int64 labels) {cache / 2**20:,.0f} MiB")
    data = {
        **stamp("python -m bench.data_rss", argv),
        "file_bytes": size, "rows": rows, "features": args.features, "cache_bytes": cache,
        "nproc": args.nproc, "steps": args.steps, "batch_size": args.batch_size, "runs": results,
    }  # fmt: skip
    print(f"results: {save_results('data_rss', data, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
