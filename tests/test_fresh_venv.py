"""The quickstart in a fresh virtual environment that holds only torch and the generated project.

ddp-new's own test extras pull in packages (numpy, tensorboard, ...) that a user's environment
may lack; a generated project must declare everything it imports. This test follows the
generated README to the letter in an environment made for it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest
from conftest import render

pytestmark = pytest.mark.slow


def sh(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def link_torch(env_dir: Path, folder: Path) -> None:
    """The venv gets the torch this suite runs with, and nothing else: a .pth file names a
    folder of links to torch's installed files, and its console scripts are written as pip
    writes them. pip sees torch installed and installs what torch requires itself. (Installing
    the same wheel again unpacks 900 MB: a minute of the test on 2 cores.)"""
    dist = importlib.metadata.distribution("torch")
    installed = Path(dist.locate_file(""))
    folder.mkdir()
    for top in sorted({Path(str(file)).parts[0] for file in dist.files or []} - {".."}):
        (folder / top).symlink_to(installed / top)
    site_packages = next((env_dir / "lib").glob("python3*/site-packages"))
    (site_packages / "torch-only.pth").write_text(f"{folder}\n")
    for script in dist.entry_points.select(group="console_scripts"):
        path = env_dir / "bin" / script.name
        module, function = script.value.split(":")
        path.write_text(
            f"#!{env_dir / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\n"
            f"if __name__ == '__main__':\n    sys.exit({function}())\n"
        )
        path.chmod(0o755)


def test_quickstart_in_a_fresh_venv(template_dir: Path, tmp_path: Path) -> None:
    """One venv, two projects in turn: the quickstart's (logger none) first, so that nothing a
    later install brings (tensorboard pulls numpy, say) hides what it failed to declare; then a
    tensorboard project, whose install must bring tensorboard itself."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", OMP_NUM_THREADS="1", PIP_QUIET="1")
    pip = [bin_dir / "python", "-m", "pip"]
    # The torch this suite runs with (CI: the CPU build), then the README's install command.
    link_torch(env_dir, tmp_path / "torch-only")

    project = render(template_dir, tmp_path / "fresh")
    sh([*pip, "install", "-e", ".[dev]"], project, env)
    imported = sh([bin_dir / "python", "-c", "import numpy, tqdm, fresh.train"], project, env)
    assert imported.returncode == 0
    absent = sh([bin_dir / "python", "-c", "import importlib.util as u; print(u.find_spec('tensorboard'))"],
                project, env)  # fmt: skip
    assert absent.stdout.strip() == "None"  # the quickstart project does not need it

    sh([bin_dir / "python", "-m", "fresh.train", "--max-steps", "5", "--device", "cpu"], project, env)
    torchrun = [bin_dir / "torchrun", "--standalone", "--nproc_per_node=2", "-m", "fresh.train"]
    run = sh([*torchrun, "--max-steps", "10", "--device", "cpu", "--out-dir", "runs/two"], project, env)
    assert "done: 10 steps" in run.stdout + run.stderr
    assert (project / "runs" / "two" / "checkpoints" / "step_00000010.pt").is_file()
    # Its tests find everything they import among what it declares (collecting a test file imports
    # it), and its quick config and checkpoint tests pass in two test processes, as its README runs
    # them (pytest-xdist comes with the dev extra); the whole suite runs in another test.
    pytest = [bin_dir / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collected = sh([*pytest, "--collect-only"], project, env)
    assert "tests/test_faults.py::" in collected.stdout
    assert re.fullmatch(r"\d+ tests collected in [\d.]+s", collected.stdout.splitlines()[-1])  # no errors
    quick = ["-n", "2", "-m", "not slow", "tests/test_config.py", "tests/test_checkpoint.py"]
    tests = sh([*pytest, *quick], project, env)
    assert " passed" in tests.stdout  # without pytest-xdist, -n would be an unknown option

    # A project that logs to TensorBoard installs what it needs, and writes its event files.
    logged = render(template_dir, tmp_path / "logged", logger="tensorboard")
    sh([*pip, "install", "-e", "."], logged, env)
    sh([bin_dir / "python", "-m", "logged.train", "--max-steps", "5", "--device", "cpu"], logged, env)
    assert list((logged / "runs" / "default").rglob("events.out.tfevents.*"))
