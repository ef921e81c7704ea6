"""ddp-new's home link (~/.local/share/ddp-new/template.bundle) is touched only by the commands
that render or update, never by --version, --help or options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["options"], ["new", "--help"]])
def test_commands_that_render_nothing_leave_home_alone(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bundle = tmp_path / "template.bundle"  # what an installed wheel ships
    bundle.write_bytes(b"")
    env = {**os.environ, "HOME": str(home), "DDP_NEW_BUNDLE": str(bundle)}
    proc = subprocess.run(
        [sys.executable, "-c", "from generator.cli import main; main()", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(home.rglob("*")) == []
