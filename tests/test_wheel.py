"""The wheel carries the template: install it in a fresh virtual environment and render there."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml
from conftest import REPO, work_dir

pytestmark = pytest.mark.slow


def sh(cmd: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_wheel_renders_without_the_source_tree(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    sh(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, REPO],
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("ddp_new-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    sh([bin_dir / "python", "-m", "pip", "install", "-q", wheel], cwd=tmp_path)

    work = work_dir(tmp_path)
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean_env["PATH"] = f"{bin_dir}{os.pathsep}{clean_env['PATH']}"
    sh([bin_dir / "ddp-new", "demo", "--defaults"], cwd=work, env=clean_env)

    project = work / "demo"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert str(REPO) not in answers["_src_path"], "rendered from the source tree, not the wheel"
    assert (project / "src" / "demo" / "train.py").is_file()
    assert (project / "scripts" / "train_local.sh").is_file()
    installed = sh(
        [bin_dir / "python", "-c", "import generator; print(generator.__file__)"], cwd=work, env=clean_env
    )
    assert str(env_dir) in installed.stdout
