"""Generate projects and run them: one process, torchrun with two gloo ranks, and their own tests."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from conftest import answers_of, python, render, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(template_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render(template_dir, tmp_path_factory.mktemp("run") / "demo")


def check_run(out_dir: Path, steps: int) -> list[dict]:
    """metrics.jsonl exists with finite losses up to `steps`, and the last step was checkpointed."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train and train[-1]["step"] == steps
    for record in train:
        assert math.isfinite(record["loss"]) and record["samples_per_sec"] > 0
        assert {"step", "loss", "lr", "samples_per_sec"} <= set(record)
    assert (out_dir / "checkpoints" / f"step_{steps:08d}.pt").is_file()
    return train


def test_one_process(project: Path, tmp_path: Path) -> None:
    package = answers_of(project)["package_name"]
    proc = run(python("-m", f"{package}.train", "--max-steps", "5", "--out-dir", tmp_path), cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_run(tmp_path, 5)


def test_torchrun_two_processes(project: Path, tmp_path: Path) -> None:
    package = answers_of(project)["package_name"]
    cmd = python(
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", f"{package}.train", "--max-steps", "5", "--out-dir", tmp_path,
    )  # fmt: skip
    proc = run(cmd, cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_run(tmp_path, 5)


# The generated suite for answers that together take every value class the questions offer:
# each precision, accumulation 1 and more (the suite's own tests must not assume 1 or 2), the
# loggers (tensorboard, wandb, mlflow; none in the quickstart tests), the script launchers, none,
# one alone, and the cluster launchers together (slurm, kubernetes); the language-model task; the
# lean core (no features), every capability alone and all of them together (fsdp as the default
# strategy).
ALL_FEATURES = ["fsdp", "comm_hooks", "tools", "profiler"]
LEAN = dict(precision="bf16", logger="wandb")
SUITE_MATRIX = {
    "lean-bf16-accum1-all-launchers-wandb-faults": LEAN,
    "lean-bf16-accum1-all-launchers-wandb-all-but-faults": LEAN,
    "all-features-fsdp-fp16-accum2-local": dict(
        features=ALL_FEATURES, strategy="fsdp", precision="fp16", grad_accum_steps=2, launchers=["local"]
    ),
    "fp16-accum3-tensorboard-no-launchers": dict(
        precision="fp16", grad_accum_steps=3, logger="tensorboard", launchers=[]
    ),
    "fp32-accum2-slurm-kubernetes-mlflow": dict(
        precision="fp32", grad_accum_steps=2, launchers=["slurm", "kubernetes"], logger="mlflow"
    ),
    "lm-bf16-accum2-local-tools-profiler": dict(
        task="lm", precision="bf16", grad_accum_steps=2, launchers=["local"], features=["tools", "profiler"]
    ),
    "fsdp-alone": dict(features=["fsdp"], strategy="fsdp", launchers=["local"]),
    "comm-hooks-alone": dict(features=["comm_hooks"], launchers=["local"]),
    "tools-alone": dict(features=["tools"], launchers=["local"]),
    "profiler-alone": dict(features=["profiler"], launchers=["local"]),
}
# Rows that run part of the suite, to keep CI time down (two cores): the lean core runs all of
# it, in two rows that two test processes (-n 2) take at once (test_faults.py is about half of
# the time); every other row the tests that its answers change, so that each test
# runs under the answers it depends on: the fsdp default's checkpoints and resume, DDP == one
# process at fp16 and accumulation 3, a tracking logger (mlflow) and the Kubernetes launcher (the
# scripts' tests: the lean rows), the language model, and each capability's own tests with that
# capability alone (ruff for every row and more: tests/test_render.py).
SUITE_SELECTION = {
    "lean-bf16-accum1-all-launchers-wandb-faults": ["tests/test_faults.py"],
    "lean-bf16-accum1-all-launchers-wandb-all-but-faults": ["--ignore=tests/test_faults.py"],
    "all-features-fsdp-fp16-accum2-local": ["tests/test_checkpoint.py", "tests/test_resume.py"],
    "fp16-accum3-tensorboard-no-launchers": ["tests/test_config.py", "tests/test_distributed.py"],
    "fp32-accum2-slurm-kubernetes-mlflow": ["tests/test_tracking.py", "tests/test_kubernetes.py"],
    "lm-bf16-accum2-local-tools-profiler": [
        "tests/test_lm.py", "tests/test_hf.py", "tests/test_distributed.py", "tests/test_tools.py",
    ],
    "fsdp-alone": ["tests/test_fsdp.py"],
    "comm-hooks-alone": ["tests/test_comm_hooks.py"],
    "tools-alone": ["tests/test_tools.py", "tests/test_plot.py"],
    "profiler-alone": ["tests/test_profiler.py"],
}  # fmt: skip


@pytest.mark.parametrize("row", list(SUITE_MATRIX))
def test_generated_test_suite_passes(template_dir: Path, tmp_path: Path, row: str) -> None:
    project = render(template_dir, tmp_path / "suite", **SUITE_MATRIX[row])
    tests = SUITE_SELECTION.get(row, [])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    proc = run(command, cwd=project, timeout=2400)  # test_faults.py took over 1200 s under load
    tail = proc.stdout[-6000:] + "\n--- stderr ---\n" + proc.stderr[-2000:]  # the summary, then logs
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "no tests ran" not in proc.stdout, tail


# The image task needs torchvision, which must match torch's release: .ci/run makes a venv with
# both (IMAGE_PYTHON); without one, this row is skipped.
IMAGE_PYTHON = os.environ.get("IMAGE_PYTHON", "")
IMAGE_TESTS = [
    "tests/test_images.py", "tests/test_distributed.py", "tests/test_train.py", "tests/test_config.py",
    "tests/test_resume.py", "tests/test_randomness.py", "tests/test_errors.py",
]  # fmt: skip


@pytest.mark.skipif(not IMAGE_PYTHON, reason="IMAGE_PYTHON: a Python with torch and torchvision")
def test_image_project_suite_passes(template_dir: Path, tmp_path: Path) -> None:
    project = render(template_dir, tmp_path / "images", task="image", launchers=["local"])
    command = [IMAGE_PYTHON, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *IMAGE_TESTS]
    proc = run(command, cwd=project, timeout=2400)
    tail = proc.stdout[-6000:] + "\n--- stderr ---\n" + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert " passed" in proc.stdout and not any("test_images" in s for s in skipped), tail
