"""Smoke test of the image workload (`python -m bench.image --quick`): every contender runs on the
generated folder and reports a positive images/s. No speed assertions: figures belong to the bench."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def torchvision_python() -> str:
    """A Python with torchvision: this one, or the image task's venv (.ci/run's IMAGE_PYTHON)."""
    python = sys.executable if importlib.util.find_spec("torchvision") else os.environ.get("IMAGE_PYTHON")
    if not python:
        pytest.skip("needs torchvision, here or in IMAGE_PYTHON")
    return python


@pytest.mark.slow
def test_bench_image_quick_reports_every_contender(tmp_path: Path) -> None:
    python = torchvision_python()
    out = tmp_path / "image.json"
    cmd = [python, "-m", "bench.image", "--quick", "--world-sizes", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert str(out) in done.stdout  # the results path is printed

    result = json.loads(out.read_text())
    assert result["contenders"] == ["reference-same-work", "examples-imagenet", "timm-train", "generated"]
    rows = result["summary"]["jpeg W=1"]
    for contender in result["contenders"]:
        rate = rows[contender]["median_images_per_sec"]
        assert rate is not None and math.isfinite(rate) and rate > 0, (contender, rate)
        shares = [rows[contender][k] for k in ("data_share", "compute_share", "other_share")]
        assert all(s is not None for s in shares) and math.isclose(sum(shares), 1.0), (contender, shares)
    # The start-up account: one epoch (16 images a class, 8 classes, batch 16: 8 steps), every
    # phase clocked, the phases inside the run's wall time.
    (startup,) = result["startup"]
    assert "error" not in startup and startup["exit_status"] == 0, startup
    assert startup["calls"]["steps"] == 8
    phases = [startup[p] for p in result["startup_phases"]]
    assert len(phases) > 10, result["startup_phases"]
    assert all(s >= 0 for s in phases), startup
    assert sum(phases) < startup["wall_s"], startup
    assert 0 < startup["first step done"] < startup["last save done"] < startup["wall_s"], startup
    runs = result["runs"]
    assert all(r["optimizer_steps_seen"] == r["warmup_steps"] + r["timed_steps"] + 1 for r in runs)
    assert all(r["global_batch"] == 16 for r in runs)
    loader = {(r["pipeline"], r["workers"]) for r in result["loader"]}
    assert ("trainer (images.py)", 1) in loader and ("torchvision ImageFolder", 2) in loader
    assert all(r["per_worker"] > 0 for r in result["loader"])


@pytest.mark.slow
def test_image_step_bench_times_each_variant() -> None:
    cmd = [torchvision_python(), "-m", "bench.image_step", "--rounds", "2", "--steps", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("  ")]
    variants = ["torch-dropout", "keyed-dropout", "trainer-step", "torch-dropout-again"]
    assert [row[0] for row in rows] == variants
    assert all(float(row[1]) > 0 for row in rows) and rows[0][3] == "x1.0000", rows
