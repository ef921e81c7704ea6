"""Shared helpers: render projects with the real CLI and run commands in them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from generator.cli import app

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The generated projects' suites first: they are the longest tests, so with two test
    processes (-n 2) they start at once, and the short ones fill the gaps."""
    items.sort(key=lambda item: item.originalname != "test_generated_test_suite_passes")


@pytest.fixture(scope="session", autouse=True)
def default_signal_handling() -> None:
    """Undo an inherited "ignore" of SIGINT, SIGTERM and SIGHUP, as a terminal's shell would.

    A script's background job (`pytest &` in a non-interactive shell) starts with SIGINT
    ignored, and an ignored signal stays ignored in every child across exec: the CLI under
    test would then never see the Ctrl-C or SIGTERM a test sends it, and the test would hang.
    """
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):  # Windows has no SIGHUP
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) == signal.SIG_IGN:
            default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
            signal.signal(number, default)  # a child starts with the default (exec resets handlers)


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh HOME: the template link and git settings of the machine stay untouched."""
    home = tmp_path_factory.mktemp("home")
    saved = dict(os.environ)
    os.environ["HOME"] = str(home)
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = "Test User"
        os.environ[f"GIT_{role}_EMAIL"] = "test@example.com"
    os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
    yield home
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def template_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree's template as a plain directory, so tests render exactly what is on disk."""
    root = tmp_path_factory.mktemp("template")
    shutil.copy2(REPO / "copier.yml", root / "copier.yml")
    shutil.copytree(REPO / "template", root / "template", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def cli(*args: str | Path, cwd: Path | None = None):
    """Run `ddp-new ARGS` in-process; returns click's Result (exit_code, output, stderr)."""
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def render(template: Path, dest: Path, **answers: object) -> Path:
    """Render a project with --defaults plus `answers`; assert success and return its path."""
    data = []
    for key, value in answers.items():
        data += ["--data", f"{key}={_as_data(value)}"]
    result = cli(dest.name, "--defaults", "--template", template, "--dest", dest, *data)
    assert result.exit_code == 0, result.output
    return dest


def _as_data(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(value)
    return str(value)


def answers_of(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def run(cmd: list[str | Path], cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """Run a command in a generated project with its src/ importable and one thread per process."""
    full_env = {**os.environ, "PYTHONPATH": str(cwd / "src"), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def python(*args: str | Path) -> list[str | Path]:
    return [sys.executable, *args]


def write_template(directory: Path, questions: str, **files: str) -> Path:
    """A throwaway copier template: copier.yml holding `questions`, and `files` by name
    (dots as in the file name: `write_template(d, q, **{"bad.txt.jinja": "..."})`)."""
    directory.mkdir(parents=True)
    (directory / "copier.yml").write_text(questions)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def work_dir(tmp_path: Path) -> Path:
    """An empty directory to run the CLI in."""
    work = tmp_path / "work"
    work.mkdir()
    return work
