"""On a CUDA machine: train generated projects with nccl on every visible GPU, in bf16 and fp16.

    python -m pytest -q -m gpu        # or tests/gpu/run.sh on a fresh GPU machine

Skipped without CUDA.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import python, render, run

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_train_on_all_gpus_with_nccl(template_dir: Path, tmp_path: Path, precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    project = render(template_dir, tmp_path / "proj", precision=precision)
    out = tmp_path / "run"
    gpus = torch.cuda.device_count()
    cmd = python(
        "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
        "-m", "proj.train", "--device", "cuda", "--max-steps", "30", "--out-dir", out,
    )  # fmt: skip
    proc = run(cmd, cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0], "the loss did not go down"
    assert (out / "checkpoints" / "step_00000030.pt").is_file()


ALL_FEATURES = ["fsdp", "comm_hooks", "tools", "profiler"]


@pytest.mark.parametrize(
    "answers",
    [{}, {"features": ALL_FEATURES}, {"task": "lm"}, {"task": "image"}],
    ids=["lean", "all", "lm", "image"],
)
def test_generated_gpu_tests_pass(template_dir: Path, tmp_path: Path, answers: dict) -> None:
    # Each task's own project: its model, data and loss under nccl, bf16 and fp16, resume on GPU.
    if answers.get("task") == "image":
        pytest.importorskip("torchvision")
    project = render(template_dir, tmp_path / "proj", **answers)
    proc = run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"], cwd=project)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
