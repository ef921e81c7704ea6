"""The generated test ids each CI row runs, and whether a new row matrix still runs every one.

    python tests/row_ids.py --out before.json          # render each row, collect what it runs
    python tests/row_ids.py --compare before.json after.json

A row of tests/test_generated_project.py renders a project with its answers and runs pytest
there (suite_commands): collecting those same commands with --collect-only lists the ids the row
runs, without running them. --compare exits 1 and names each id that some row ran before and no
row runs after, so a faster matrix is shown to leave no test out. The image row needs a Python
with torchvision ($IMAGE_PYTHON); without one it is left out of the list, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from conftest import REPO, render  # noqa: E402
from test_generated_project import (  # noqa: E402
    ENGINE_TESTS,
    IMAGE_ANSWERS,
    IMAGE_TESTS,
    SUITE_MATRIX,
    SUITE_SELECTION,
    left_out,
    runs_quick,
    suite_commands,
)


def rows() -> dict[str, tuple[dict, list[str], bool, list[str], str]]:
    """Each row: its answers, its selection, whether it runs the quick suite too, the quick
    tests it leaves out, its Python."""
    table = {
        name: (SUITE_MATRIX[name], SUITE_SELECTION[name], runs_quick(name), left_out(name), sys.executable)
        for name in SUITE_MATRIX
    }
    image_python = os.environ.get("IMAGE_PYTHON", "")
    if image_python:
        table["image"] = (IMAGE_ANSWERS, IMAGE_TESTS, True, ENGINE_TESTS, image_python)
    else:
        print("IMAGE_PYTHON is not set: the image row is left out", file=sys.stderr)
    return table


def collect(project: Path, command: list[str]) -> list[str]:
    """The test ids one pytest command of a row would run."""
    env = {**os.environ, "PYTHONPATH": "src"}
    command = [part for part in command if not part.startswith("--numprocesses")]  # ids, not workers
    done = subprocess.run([*command, "--collect-only"], cwd=project, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 5):  # 5: nothing collected
        raise SystemExit(f"error: collecting in {project}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [line for line in done.stdout.splitlines() if "::" in line and " " not in line]


def list_rows(out: Path) -> None:
    """Render every row and write {row: {"answers": ..., "ids": [...]}} to `out`."""
    listed = {}
    with tempfile.TemporaryDirectory() as work:
        template = Path(work) / "template"  # the working tree's, as tests/conftest.py renders it
        template.mkdir()
        shutil.copy2(REPO / "copier.yml", template / "copier.yml")
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / "template", template / "template", ignore=skip)
        for name, (answers, selection, quick, leave_out, python) in rows().items():
            (Path(work) / name).mkdir()
            project = render(template, Path(work) / name / "demo", **answers)
            commands = suite_commands(python, selection, quick, leave_out)
            ids = [i for c in commands for i in collect(project, c)]
            listed[name] = {"answers": answers, "ids": sorted(set(ids))}
            print(f"{name}: {len(listed[name]['ids'])} test ids")
    out.write_text(json.dumps(listed, indent=1) + "\n")
    print(f"{sum(len(r['ids']) for r in listed.values())} row x test ids: {out}")


def compare(before: Path, after: Path) -> int:
    """0 when every id some row ran before runs in some row after; else name the missing ones."""
    ran = {i for row in json.loads(before.read_text()).values() for i in row["ids"]}
    runs = {i for row in json.loads(after.read_text()).values() for i in row["ids"]}
    missing = sorted(ran - runs)
    for test_id in missing:
        print(f"no longer run: {test_id}")
    print(f"{len(ran)} ids before, {len(runs)} after, {len(missing)} no longer run")
    return 1 if missing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows' test ids here")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    list_rows(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
