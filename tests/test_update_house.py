"""Updating a project of 0.7.0 or 0.8.0 across 0.9.0's move of the machinery into engine/ and
the tools into tools/: the owner's edits are kept, an edit of a moved file follows it (the
migrate_engine.py migration) or is reported there as a conflict, and the project trains."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, run
from test_update import DDP_NEW, commit_all, git, sh

from generator.migrate_engine import MOVED
from generator.releases import build_bundle, read_record

NEXT = "0.9.0"  # the release whose migration moves the files
PACKAGE = "src/demo"
# (file, the line as rendered, the owner's line): lines 0.9.0 leaves alone, so each merges cleanly.
OWNER_EDITS = [
    ("model.py", "nn.Linear(width, hidden_dim), nn.GELU()]", "nn.Linear(width, hidden_dim), nn.SiLU()]"),
    ("data.py", "SPLIT_SEED = 0 ", "SPLIT_SEED = 7 "),
    ("task.py", 'option(1000, "validation samples"', 'option(800, "validation samples"'),
]
MACHINERY_EDIT = ("checkpoint.py", "for every save\n", "for every save (owner's note)\n")
# A line 0.9.0 rewrote: the owner's edit of it cannot merge.
CONFLICTING_EDIT = ("config.py", '"""TrainConfig: every training setting,', '"""TrainConfig: our settings,')


@pytest.fixture(scope="module")
def house_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's history with the template on disk committed on top and released as NEXT,
    as the release's wheel ships it."""
    root = tmp_path_factory.mktemp("house")
    clone = root / "ddp-new"
    git(root, "clone", "-q", "--no-tags", str(REPO), str(clone))
    for release in ("0.7.0", "0.8.0"):
        if sh(["git", "cat-file", "-t", read_record(REPO)[release]], clone, check=False).returncode:
            pytest.skip(f"release {release} is not in this clone's history")
    shutil.rmtree(clone / "template")
    shutil.copytree(REPO / "template", clone / "template", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "copier.yml", clone / "copier.yml")
    for script in ("migrate_example_toml.py", "migrate_engine.py"):
        shutil.copy2(REPO / "generator" / script, clone / "generator")
    commit_all(clone, "The template on disk")
    released = git(clone, "rev-parse", "HEAD").strip()
    record = clone / "releases.toml"  # NEXT is this commit, recorded already or not
    kept = [line for line in record.read_text().splitlines(keepends=True) if not line.startswith(f'"{NEXT}"')]
    record.write_text("".join(kept) + f'"{NEXT}" = "{released}"\n')
    commit_all(clone, f"releases.toml: {NEXT}")
    version, warnings = build_bundle(clone, root / "history.bundle")
    assert (version, warnings) == (f"v{NEXT}", [])
    return root / "history.bundle"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def render_edited(bundle: Path, tmp_path: Path, release: str, machinery: tuple[str, str, str]) -> tuple:
    """A project of `release` with the owner's edits and one machinery edit, committed; the env."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(bundle)}
    sh([*DDP_NEW, "demo", "-y", "--git", "--vcs-ref", f"v{release}"], tmp_path, **env)
    project = tmp_path / "demo"
    assert (project / PACKAGE / "config.py").is_file() and not (project / PACKAGE / "engine").exists()
    for name, old, new in [*OWNER_EDITS, machinery]:
        edit(project / PACKAGE / name, old, new)
    commit_all(project, "The owner's edits")
    return project, env


def assert_moved(project: Path) -> None:
    """No machinery left at the package's top; the moves are staged, nothing else is."""
    top = [name for name in MOVED if (project / PACKAGE / name).exists()]
    assert top == [], top
    assert (project / PACKAGE / "engine" / "config.py").is_file()
    staged = git(project, "diff", "--cached", "--name-only").split()
    assert set(staged) <= {f"{PACKAGE}/{name}" for name in MOVED}, staged


@pytest.mark.parametrize("release", [pytest.param("0.7.0", marks=pytest.mark.slow), "0.8.0"])
def test_an_edited_project_updates_across_the_move(house_bundle: Path, tmp_path: Path, release: str) -> None:
    project, env = render_edited(house_bundle, tmp_path, release, MACHINERY_EDIT)
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"from template v{release} to v{NEXT}" in proc.stdout
    for name, _, new in OWNER_EDITS:
        assert new in (project / PACKAGE / name).read_text(), name
    name, _, new = MACHINERY_EDIT
    assert new in (project / PACKAGE / "engine" / name).read_text()
    assert f"moved    {PACKAGE}/{name} -> {PACKAGE}/engine/{name}: your edits carried over" in proc.stdout
    assert f"removed  {PACKAGE}/{name}\n" in proc.stdout
    assert_moved(project)
    assert [p for p in (project / "src").rglob("*.py") if "<<<<<<<" in p.read_text()] == []

    train = run([sys.executable, "-m", "demo.train", "--max-steps", "2", "--device", "cpu"], project)
    assert train.returncode == 0, train.stdout + train.stderr
    assert "step 2" in train.stdout + train.stderr, train.stdout + train.stderr


def test_an_edit_that_cannot_follow_the_move_is_a_conflict_at_the_new_path(
    house_bundle: Path, tmp_path: Path
) -> None:
    project, env = render_edited(house_bundle, tmp_path, "0.8.0", CONFLICTING_EDIT)
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False, **env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    name, _, new = CONFLICTING_EDIT
    moved = f"{PACKAGE}/engine/{name}"
    assert f"moved    {PACKAGE}/{name} -> {moved}: your edits conflict there" in proc.stdout
    assert f"conflict {moved}  (edit the <<<<<<< markers)" in proc.stderr
    text = (project / moved).read_text()
    assert text.startswith("<<<<<<< before updating\n") and new in text and "RunConfig" in text
    assert_moved(project)
    for name, _, new in OWNER_EDITS:
        assert new in (project / PACKAGE / name).read_text(), name
