"""An upgrade as users make it: a project from an older released wheel, updated by this one.

The old wheel is built from the repository's own history (release 0.1.0, whose checkout had no
tags, so its projects record a bare commit hash), installed beside this one, and used exactly as
a user did: render, commit, edit, then `ddp-new update` with the new wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from generator.releases import read_record

pytestmark = pytest.mark.slow
OLD_RELEASE = "0.1.0"  # configs/default.toml, before 0.2.0 renamed it (and migrates edits)


def sh(cmd: list, cwd: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, env={**full_env, **env}
    )
    if check:
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def install_wheel(source: Path, tmp_path: Path, name: str) -> Path:
    """Build a wheel from `source` and install it (without dependencies) into its own directory."""
    dist = tmp_path / f"{name}-dist"
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, source],
       tmp_path)  # fmt: skip
    (wheel,) = dist.glob("ddp_new-*.whl")
    site = tmp_path / f"{name}-site"
    sh([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel], tmp_path)
    return site


def test_update_from_the_first_release_runs_its_migrations(tmp_path: Path) -> None:
    commit = read_record(REPO)[OLD_RELEASE]
    if sh(["git", "cat-file", "-t", commit], REPO, check=False).returncode != 0:
        pytest.skip(f"release {OLD_RELEASE} ({commit[:12]}) is not in this clone's history")
    old_checkout = tmp_path / "old-checkout"
    sh(["git", "clone", "-q", "--no-tags", REPO, old_checkout], tmp_path)
    sh(["git", "checkout", "-q", commit], old_checkout)
    old_site = install_wheel(old_checkout, tmp_path, "old")
    new_site = install_wheel(REPO, tmp_path, "new")
    home = tmp_path / "home"
    home.mkdir()

    def ddp_new(site: Path, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
        return sh([sys.executable, "-m", "generator", *args], tmp_path, check, HOME=str(home),
                  PYTHONPATH=str(site))  # fmt: skip

    assert ddp_new(old_site, "--version").stdout.strip() == f"ddp-new {OLD_RELEASE}"
    ddp_new(old_site, "proj", "-y")
    project = tmp_path / "proj"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert commit.startswith(answers["_commit"])  # a bare hash: that checkout had no tags
    sh(["git", "init", "-q"], project)
    sh(["git", "add", "-A"], project)
    sh(["git", "commit", "-q", "-m", "Render with 0.1.0"], project)
    config = project / "configs" / "default.toml"
    config.write_text(config.read_text().replace("seed = 0", "seed = 7  # mine"))
    sh(["git", "commit", "-q", "-am", "My seed"], project)

    proc = ddp_new(new_site, "update", project, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The 0.2.0 migration merged the edit into the file's new name.
    assert not config.exists()
    assert "seed = 7  # mine" in (project / "configs" / "example.toml").read_text()
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    # A release, or vX.Y.Z.postN+git-gHASH between releases.
    assert recorded["_commit"].startswith("v"), recorded["_commit"]
    # 0.1.0 had none of the optional capabilities (features): the update adds none of them.
    assert recorded["features"] == [] and "strategy" not in recorded, recorded
    optional = {"fsdp.py", "comm_hooks.py", "check_sync.py", "doctor.py", "plot.py", "profiling.py"}
    assert optional.isdisjoint(path.name for path in (project / "src" / "proj").iterdir())
