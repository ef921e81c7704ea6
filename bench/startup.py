"""Start-up cost of the CLI: `ddp-new --help` and friends against `python -c pass`.

    python -m bench.startup [--repeats 15]

Commands are run interleaved (A B C A B C ...) so machine noise hits all of them alike;
the report gives the median wall time of each and its ratio to `python -c pass`.
It also times rendering a project with defaults, the one step that imports copier.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "generator"]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "ddp-new --help": [*CLI, "--help"],
    "ddp-new --version": [*CLI, "--version"],
    "ddp-new options": [*CLI, "options"],
}


def timed(cmd: list[str], cwd: str | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    return time.perf_counter() - start


def measure(repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    samples["ddp-new demo --defaults"] = []
    for _ in range(repeats):
        for name, cmd in COMMANDS.items():
            samples[name].append(timed(cmd))
        work = tempfile.mkdtemp()
        try:
            samples["ddp-new demo --defaults"].append(timed([*CLI, "demo", "--defaults"], cwd=work))
        finally:
            shutil.rmtree(work)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the medians to this file")
    args = parser.parse_args()
    medians = measure(args.repeats)
    base = medians["python -c pass"]
    print(f"{'command':<28}{'median ms':>10}{'x python -c pass':>18}")
    for name, seconds in medians.items():
        print(f"{name:<28}{seconds * 1000:>10.1f}{seconds / base:>18.2f}")
    if args.json:
        args.json.write_text(json.dumps({"median_s": medians, "repeats": args.repeats}, indent=2))


if __name__ == "__main__":
    main()
