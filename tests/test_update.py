"""Template updates with real git repositories, the real copier CLI and the real ddp-new CLI, offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from generator import __version__
from generator.releases import read_record
from generator.update import _has_marker

DDP_NEW = [sys.executable, "-m", "generator"]
COPIER = [sys.executable, "-m", "copier"]
# The older release, and the one the installed ddp-new renders (so the bundled path picks it).
OLD, NEW = "v0.0.1", f"v{__version__}"
NOTES_V1 = "alpha\nbeta\ngamma\n"
NOTES_V2 = "alpha\nbeta, improved\ngamma\n"


def sh(cmd: list, cwd: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}
    )
    if check:
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def git(cwd: Path, *args: str) -> str:
    return sh(["git", *args], cwd).stdout


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)  # a clean checkout: nothing new


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A template repository with two releases: NEW changes, adds and removes a file."""
    repo = tmp_path_factory.mktemp("tpl") / "ddp-new"
    repo.mkdir()
    config = yaml.safe_load((REPO / "copier.yml").read_text())
    config.pop("_migrations", None)  # these tests are about the merge; migrations are tested below
    (repo / "copier.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copytree(REPO / "template", repo / "template", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "template" / "notes.txt").write_text(NOTES_V1)
    (repo / "template" / "old.txt").write_text("removed in NEW\n")
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, OLD)
    git(repo, "tag", OLD)
    (repo / "template" / "notes.txt").write_text(NOTES_V2)  # changed
    (repo / "template" / "new.txt").write_text("added in NEW\n")  # added
    (repo / "template" / "old.txt").unlink()  # removed
    commit_all(repo, NEW)
    git(repo, "tag", NEW)
    return repo


@pytest.fixture(scope="module")
def rendered_project(template_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project rendered from OLD, committed, with a user edit committed on top: rendered once
    per module (and xdist worker); each test updates a copy of it (`project`)."""
    where = tmp_path_factory.mktemp("rendered")
    sh([*DDP_NEW, "demo", "-y", "--template", template_repo, "--vcs-ref", OLD], where)
    project = where / "demo"
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "Render from OLD")
    model = project / "src" / "demo" / "model.py"
    model.write_text(model.read_text() + "# user edit: keep me\n")
    commit_all(project, "User edit")
    return project


@pytest.fixture
def project(rendered_project: Path, tmp_path: Path) -> Path:
    """A copy of `rendered_project`, its git repository included, for one test to change."""
    return Path(shutil.copytree(rendered_project, tmp_path / "demo", symlinks=True))


def changed_paths(project: Path) -> set[str]:
    return {line[3:] for line in git(project, "status", "--porcelain", "--untracked-files=all").splitlines()}


def assert_updated(project: Path) -> None:
    assert (project / "notes.txt").read_text() == NOTES_V2
    assert (project / "new.txt").is_file()
    assert not (project / "old.txt").exists()
    assert (project / "src" / "demo" / "model.py").read_text().endswith("# user edit: keep me\n")
    assert changed_paths(project) == {".copier-answers.yml", "notes.txt", "new.txt", "old.txt"}
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == NEW


def test_answers_record_absolute_source_and_existing_tag(project: Path, template_repo: Path) -> None:
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_src_path"] == str(template_repo.resolve())
    assert answers["_commit"] == OLD
    git(template_repo, "rev-parse", "--verify", answers["_commit"])


def test_plain_copier_update(project: Path) -> None:
    sh([*COPIER, "update", "--defaults"], project)
    assert_updated(project)


def test_ddp_new_update(project: Path) -> None:
    # old.txt is unchanged since the render: the template may delete it.
    proc = sh([*DDP_NEW, "update", project], project.parent)
    assert_updated(project)
    assert f"from template {OLD} to {NEW}" in proc.stdout
    for line in ("added    new.txt", "changed  notes.txt", "removed  old.txt"):
        assert line in proc.stdout


def edit_conflicting_line(project: Path) -> None:
    (project / "notes.txt").write_text("alpha\nbeta, the user's way\ngamma\n")
    commit_all(project, "User edit on the line the template changes")


def test_conflict_is_reported_and_exits_non_zero(project: Path) -> None:
    edit_conflicting_line(project)
    proc = sh([*DDP_NEW, "update", project], project.parent, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "conflict notes.txt" in proc.stderr
    text = (project / "notes.txt").read_text()
    assert "<<<<<<< before updating" in text and "beta, the user's way" in text and "beta, improved" in text

    # The project's pre-commit hooks refuse to commit the markers.
    git(project, "add", "-A")
    hooks = sh([sys.executable, "-m", "pre_commit", "run", "--all-files"], project, check=False)
    assert hooks.returncode != 0
    assert "no merge conflict markers" in hooks.stdout and "notes.txt" in hooks.stdout


def test_plain_copier_leaves_markers_and_exits_zero(project: Path) -> None:
    """copier's documented behaviour, which is why ddp-new update checks for conflicts itself."""
    edit_conflicting_line(project)
    proc = sh([*COPIER, "update", "--defaults"], project, check=False)
    assert proc.returncode == 0
    assert "<<<<<<< before updating" in (project / "notes.txt").read_text()


def test_dirty_tree_is_refused(project: Path) -> None:
    (project / "scratch.txt").write_text("untracked")
    before = (project / ".copier-answers.yml").read_text()
    proc = sh([*DDP_NEW, "update", project], project.parent, check=False)
    assert proc.returncode == 2
    assert "uncommitted or untracked" in proc.stderr and "Traceback" not in proc.stderr
    assert (project / ".copier-answers.yml").read_text() == before
    assert changed_paths(project) == {"scratch.txt"}


def test_non_git_project_is_refused(template_repo: Path, tmp_path: Path) -> None:
    sh([*DDP_NEW, "demo", "-y", "--template", template_repo, "--vcs-ref", OLD], tmp_path)
    project = tmp_path / "demo"
    before = sorted(p.name for p in project.iterdir())
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False)
    assert proc.returncode == 2
    assert "not a git repository" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in project.iterdir()) == before


def test_not_a_project_is_refused(tmp_path: Path) -> None:
    proc = sh([*DDP_NEW, "update", tmp_path], tmp_path, check=False)
    assert proc.returncode == 2
    assert "no .copier-answers.yml" in proc.stderr


def test_update_with_changed_answer_adds_its_files(template_repo: Path, tmp_path: Path) -> None:
    sh([*DDP_NEW, "demo", "-y", "--git", "--template", template_repo, "--data", "launchers=local"], tmp_path)
    project = tmp_path / "demo"
    assert changed_paths(project) == set()  # --git committed everything
    assert not (project / "scripts" / "train_slurm.sbatch").exists()
    proc = sh([*DDP_NEW, "update", project, "--data", "launchers=local,slurm"], tmp_path)
    assert (project / "scripts" / "train_slurm.sbatch").is_file()
    assert "added    scripts/train_slurm.sbatch" in proc.stdout
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["launchers"] == ["local", "slurm"]


KUBERNETES_FILES = [
    "Dockerfile", ".dockerignore", "k8s/trainjob.yaml", "k8s/pvc.yaml", "k8s/crd/refresh.py",
    "k8s/crd/trainer.kubeflow.org_trainjobs.yaml", "k8s/crd/LICENSE", "docs/kubernetes.md",
    "tests/test_kubernetes.py",
]  # fmt: skip


def test_update_adds_the_kubernetes_launcher(template_repo: Path, tmp_path: Path) -> None:
    sh([*DDP_NEW, "demo", "-y", "--git", "--template", template_repo, "--data", "launchers=local"], tmp_path)
    project = tmp_path / "demo"
    assert not [name for name in KUBERNETES_FILES if (project / name).exists()]
    proc = sh([*DDP_NEW, "update", project, "--data", "launchers=local,kubernetes"], tmp_path)
    for name in KUBERNETES_FILES:
        assert (project / name).is_file(), name
        assert f"added    {name}" in proc.stdout, proc.stdout
    assert (project / "scripts" / "train_local.sh").is_file()
    assert '"jsonschema>=' in (project / "pyproject.toml").read_text()  # what test_kubernetes.py needs
    assert "kubectl create -f k8s/trainjob.yaml" in (project / "README.md").read_text()
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["launchers"] == ["local", "kubernetes"]


def test_update_rejects_bad_answer(project: Path) -> None:
    proc = sh([*DDP_NEW, "update", project, "--data", "precision=fp8"], project.parent, check=False)
    assert proc.returncode == 2
    assert "'fp8' is not one of" in proc.stderr
    assert changed_paths(project) == set()


def test_vcs_ref_pins_the_target_version(project: Path) -> None:
    proc = sh([*DDP_NEW, "update", project, "--vcs-ref", OLD], project.parent)
    assert proc.stdout.strip() == f"{project} is already up to date (template {OLD})"
    assert changed_paths(project) == set()


def test_vcs_ref_that_does_not_exist_is_named(project: Path) -> None:
    proc = sh([*DDP_NEW, "update", project, "--vcs-ref", "v9.9.9"], project.parent, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "error: --vcs-ref v9.9.9: no such tag or commit in the template\n"
    assert changed_paths(project) == set()


@pytest.mark.parametrize("content", ["_src_path: caf\xe9\n".encode("latin-1"), bytes(range(256))])
def test_unreadable_answers_file_is_one_line(project: Path, content: bytes) -> None:
    (project / ".copier-answers.yml").write_bytes(content)
    commit_all(project, "A broken answers file")
    proc = sh([*DDP_NEW, "update", project], project.parent, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: cannot read {project / '.copier-answers.yml'}: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert changed_paths(project) == set()


def test_a_changed_file_that_the_template_drops_is_kept_as_a_conflict(project: Path) -> None:
    # NEW no longer has old.txt. copier deletes it even when the user changed it.
    (project / "old.txt").write_text("removed in NEW\nbut my notes are here\n")
    commit_all(project, "User edit in a file the template will drop")
    proc = sh([*DDP_NEW, "update", project], project.parent, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "conflict old.txt" in proc.stderr and "your version is kept" in proc.stderr
    assert (project / "old.txt").read_text() == "removed in NEW\nbut my notes are here\n"
    assert "removed  old.txt" not in proc.stdout
    assert (project / "notes.txt").read_text() == NOTES_V2  # the rest of the update went through


def make_bundle(template_repo: Path, tag: str, out: Path) -> Path:
    """What the wheel of release `tag` ships: every release tag up to that one."""
    releases = [OLD, NEW]
    git(template_repo, "bundle", "create", "-q", str(out), *releases[: releases.index(tag) + 1])
    return out


def test_bundled_upgrade_on_a_fresh_machine(template_repo: Path, tmp_path: Path) -> None:
    """Render with an old ddp-new, upgrade, update on this and on a teammate's machine."""
    bundle_a = make_bundle(template_repo, OLD, tmp_path / "a.bundle")
    bundle_b = make_bundle(template_repo, NEW, tmp_path / "b.bundle")
    alice, bob = tmp_path / "alice-home", tmp_path / "bob-home"
    alice.mkdir()
    bob.mkdir()

    sh([*DDP_NEW, "demo", "-y"], tmp_path, HOME=str(alice), DDP_NEW_BUNDLE=str(bundle_a))
    project = tmp_path / "demo"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_src_path"] == "~/.local/share/ddp-new/template.bundle"  # the same on every machine
    assert answers["_commit"] == OLD
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "Render with the old ddp-new")
    clone = tmp_path / "teammate"
    git(tmp_path, "clone", "-q", str(project), str(clone))

    # Alice upgrades ddp-new. --version leaves her link alone (only commands that render or update
    # touch it); `ddp-new update` updates and leads the link to the new bundle, for plain copier.
    link = alice / ".local" / "share" / "ddp-new" / "template.bundle"
    sh([*DDP_NEW, "--version"], tmp_path, HOME=str(alice), DDP_NEW_BUNDLE=str(bundle_b))
    assert link.resolve() == bundle_a.resolve()
    sh([*DDP_NEW, "update", project], tmp_path, HOME=str(alice), DDP_NEW_BUNDLE=str(bundle_b))
    assert (project / "notes.txt").read_text() == NOTES_V2
    assert link.resolve() == bundle_b.resolve()
    commit_all(project, "Update")
    assert sh([*COPIER, "check-update", "--quiet"], project, HOME=str(alice)).returncode == 0

    # Bob has only the new ddp-new and an empty home: ddp-new update still finds OLD in its bundle.
    proc = sh([*DDP_NEW, "update", clone], tmp_path, HOME=str(bob), DDP_NEW_BUNDLE=str(bundle_b))
    assert f"from template {OLD} to {NEW}" in proc.stdout
    assert (clone / "new.txt").is_file() and not (clone / "old.txt").exists()


def test_plain_copier_update_after_upgrade(template_repo: Path, tmp_path: Path) -> None:
    """On the machine that rendered it, plain copier follows the link to the upgraded bundle."""
    bundle_a = make_bundle(template_repo, OLD, tmp_path / "a.bundle")
    home = tmp_path / "home"
    home.mkdir()
    sh([*DDP_NEW, "demo", "-y"], tmp_path, HOME=str(home), DDP_NEW_BUNDLE=str(bundle_a))
    project = tmp_path / "demo"
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "Render")
    # The upgrade replaces the installed bundle in place; the link keeps pointing at that path.
    make_bundle(template_repo, NEW, tmp_path / "b.bundle")
    check = [*COPIER, "check-update", "--quiet"]  # the generated CI's step
    assert sh(check, project, HOME=str(home)).returncode == 0
    shutil.copy2(tmp_path / "b.bundle", bundle_a)
    assert sh(check, project, check=False, HOME=str(home)).returncode == 2  # a newer version
    sh([*COPIER, "update", "--defaults"], project, HOME=str(home))
    assert (project / "notes.txt").read_text() == NOTES_V2
    assert (project / "new.txt").is_file()


@pytest.fixture(scope="module")
def renamed_config_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our template before and after the configs/default.toml -> configs/example.toml move;
    NEW also changes a line of the file (max_steps)."""
    repo = tmp_path_factory.mktemp("mig") / "ddp-new"
    repo.mkdir()
    config = yaml.safe_load((REPO / "copier.yml").read_text())
    assert any("migrate_example_toml.py" in str(m["command"]) for m in config["_migrations"])
    del config["_migrations"]  # the old release had none
    (repo / "copier.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copytree(REPO / "template", repo / "template", ignore=shutil.ignore_patterns("__pycache__"))
    configs = repo / "template" / "configs"
    (configs / "example.toml.jinja").rename(configs / "default.toml.jinja")
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, "before the move")
    git(repo, "tag", OLD)
    shutil.copy2(REPO / "copier.yml", repo / "copier.yml")
    (repo / "generator").mkdir()
    for script in ("migrate_example_toml.py", "migrate_engine.py"):  # copier.yml's migrations
        shutil.copy2(REPO / "generator" / script, repo / "generator")
    moved = configs / "example.toml.jinja"
    (configs / "default.toml.jinja").rename(moved)
    moved.write_text(moved.read_text().replace("max_steps = 300", "max_steps = 500"))
    commit_all(repo, "configs/default.toml -> configs/example.toml, with a migration")
    git(repo, "tag", NEW)
    return repo


def render_and_edit_config(
    src: Path, tmp_path: Path, old: str = "seed = 0", new: str = "seed = 1234  # my seed"
) -> Path:
    sh([*DDP_NEW, "demo", "-y", "--git", "--template", src, "--vcs-ref", OLD], tmp_path)
    project = tmp_path / "demo"
    config = project / "configs" / "default.toml"
    config.write_text(config.read_text().replace(old, new))
    assert new in config.read_text()
    commit_all(project, "My edit")
    return project


def assert_edit_followed_the_move(project: Path) -> None:
    """The user's edit and the template's change are both in example.toml, merged cleanly."""
    assert not (project / "configs" / "default.toml").exists()
    text = (project / "configs" / "example.toml").read_text()
    assert "seed = 1234  # my seed" in text and "max_steps = 500" in text
    assert "<<<<<<<" not in text and "--config configs/example.toml" in text
    # The move is staged: git (and ddp-new's report) see the user's file as moved, not lost.
    assert "D  configs/default.toml" in git(project, "status", "--porcelain").splitlines()


def test_migration_needs_trust_for_a_third_party_template(renamed_config_repo: Path, tmp_path: Path) -> None:
    project = render_and_edit_config(renamed_config_repo, tmp_path)
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "migrations" in proc.stderr and "--trust" in proc.stderr
    assert changed_paths(project) == set()
    plain = sh([*COPIER, "update", "--defaults"], project, check=False)
    assert plain.returncode != 0 and "--trust" in plain.stdout + plain.stderr
    assert changed_paths(project) == set()


def test_migration_merges_the_edits_into_the_moved_file(renamed_config_repo: Path, tmp_path: Path) -> None:
    project = render_and_edit_config(renamed_config_repo, tmp_path)
    proc = sh([*DDP_NEW, "update", "--trust", project], tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_edit_followed_the_move(project)
    assert "removed  configs/default.toml" in proc.stdout and "added    configs/example.toml" in proc.stdout


def test_plain_copier_runs_the_migration_with_trust(renamed_config_repo: Path, tmp_path: Path) -> None:
    project = render_and_edit_config(renamed_config_repo, tmp_path)
    sh([*COPIER, "update", "--defaults", "--trust"], project)
    assert_edit_followed_the_move(project)


def test_migration_leaves_a_conflict_where_both_changed_a_line(
    renamed_config_repo: Path, tmp_path: Path
) -> None:
    project = render_and_edit_config(
        renamed_config_repo, tmp_path, "max_steps = 300", "max_steps = 900  # mine"
    )
    proc = sh([*DDP_NEW, "update", "--trust", project], tmp_path, check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "conflict configs/example.toml  (edit the <<<<<<< markers)" in proc.stderr
    text = (project / "configs" / "example.toml").read_text()
    block = (
        "<<<<<<< before updating\nmax_steps = 900  # mine\n=======\nmax_steps = 500\n>>>>>>> after updating\n"
    )
    assert text.count("<<<<<<<") == 1 and block in text, text


def test_bundled_template_migrates_without_trust(renamed_config_repo: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bundle = make_bundle(renamed_config_repo, NEW, tmp_path / "b.bundle")
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(bundle)}
    sh([*DDP_NEW, "demo", "-y", "--git", "--vcs-ref", OLD], tmp_path, **env)
    project = tmp_path / "demo"
    config = project / "configs" / "default.toml"
    config.write_text(config.read_text().replace("seed = 0", "seed = 1234  # my seed"))
    commit_all(project, "My seed")
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_edit_followed_the_move(project)


def test_a_file_of_the_users_where_the_template_moves_another_is_a_conflict(
    renamed_config_repo: Path, tmp_path: Path
) -> None:
    """The user edited configs/default.toml and wrote their own configs/example.toml; the new
    template moves the first to the second. Neither the edits nor the user's file may be lost."""
    home = tmp_path / "home"
    home.mkdir()
    bundle = make_bundle(renamed_config_repo, NEW, tmp_path / "b.bundle")
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(bundle)}
    sh([*DDP_NEW, "demo", "-y", "--git", "--vcs-ref", OLD], tmp_path, **env)
    project = tmp_path / "demo"
    config, mine = project / "configs" / "default.toml", project / "configs" / "example.toml"
    edited = config.read_text().replace("seed = 0", "seed = 1234  # my seed")
    config.write_text(edited)
    mine.write_text("my_own_setting = 1\n")
    commit_all(project, "My seed, my example")
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False, **env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert config.read_text() == edited  # kept as committed: the migration could not move it
    assert "conflict configs/default.toml  (the new template dropped or moved" in proc.stderr
    assert "my_own_setting = 1" in mine.read_text() and "<<<<<<< before updating" in mine.read_text()
    assert "conflict configs/example.toml  (edit the <<<<<<< markers)" in proc.stderr


@pytest.fixture(scope="module")
def untagged_repo(renamed_config_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """renamed_config_repo as it arrives without its tags: the releases are in releases.toml only."""
    repo = tmp_path_factory.mktemp("untagged") / "ddp-new"
    git(renamed_config_repo.parent, "clone", "-q", "--no-tags", str(renamed_config_repo), str(repo))
    assert git(repo, "tag").strip() == ""
    old, new = (git(repo, "rev-parse", f"HEAD{parent}").strip() for parent in ("^", ""))
    (repo / "releases.toml").write_text(f'[releases]\n"{OLD[1:]}" = "{old}"\n"{NEW[1:]}" = "{new}"\n')
    commit_all(repo, "Record the releases")  # the template is unchanged: NEW is what renders
    return repo


def test_hash_only_render_gets_its_migration(untagged_repo: Path, tmp_path: Path) -> None:
    """A project from a build without tags records a bare hash; the next release still migrates it."""
    from generator.releases import build_bundle

    home = tmp_path / "home"
    home.mkdir()
    # What an old wheel built from a checkout without tags shipped: history, HEAD, no tags.
    old_checkout = tmp_path / "old-checkout"
    git(tmp_path, "clone", "-q", str(untagged_repo), str(old_checkout))
    git(old_checkout, "checkout", "-q", "HEAD~2")
    git(old_checkout, "bundle", "create", "-q", str(tmp_path / "old.bundle"), "HEAD")
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(tmp_path / "old.bundle")}
    sh([*DDP_NEW, "demo", "-y", "--git"], tmp_path, **env)
    project = tmp_path / "demo"
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"]
    assert not recorded.startswith("v")  # a bare hash: copier found no version
    config = project / "configs" / "default.toml"
    config.write_text(config.read_text().replace("seed = 0", "seed = 1234  # my seed"))
    commit_all(project, "My seed")

    version, warnings = build_bundle(untagged_repo, tmp_path / "new.bundle")
    assert (version, warnings) == (NEW, [])
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False, HOME=str(home),
              DDP_NEW_BUNDLE=str(tmp_path / "new.bundle"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"from template {recorded} to {NEW}" in proc.stdout
    assert_edit_followed_the_move(project)  # the migration ran: the user's seed was kept
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == NEW


def test_plain_copier_names_the_versions(untagged_repo: Path, tmp_path: Path) -> None:
    from generator.releases import build_bundle

    home = tmp_path / "home"
    home.mkdir()
    build_bundle(untagged_repo, tmp_path / "b.bundle")
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(tmp_path / "b.bundle")}
    sh([*DDP_NEW, "demo", "-y", "--git", "--vcs-ref", OLD], tmp_path, **env)
    project = tmp_path / "demo"
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == OLD
    proc = sh([*COPIER, "update", "--defaults", "--trust"], project, HOME=str(home))
    output = proc.stdout + proc.stderr
    assert "No git tags found" not in output, output
    assert f"Updating to template version {NEW[1:]}" in output, output
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == NEW


def answers(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def test_plain_copier_agrees_with_ddp_new_between_releases(untagged_repo: Path, tmp_path: Path) -> None:
    """A build from a checkout some commits after a release, without tags: plain `copier update`
    and `copier check-update` go where `ddp-new update` goes, never "downgrading" to the release."""
    from generator.releases import build_bundle

    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", "--no-tags", str(untagged_repo), str(checkout))
    (checkout / "template" / "notes.txt").write_text(NOTES_V1)
    commit_all(checkout, "A template change after the release")
    home, bundle = tmp_path / "home", tmp_path / "b.bundle"
    home.mkdir()
    version, _ = build_bundle(checkout, bundle)
    assert version.startswith(f"{NEW}.post2+git-g"), version
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(bundle)}
    sh([*DDP_NEW, "ours", "-y", "--git"], tmp_path, **env)
    sh([*DDP_NEW, "released", "-y", "--git", "--vcs-ref", NEW], tmp_path, **env)
    ours, released = tmp_path / "ours", tmp_path / "released"
    assert answers(ours)["_commit"] == version and answers(released)["_commit"] == NEW
    check, update = [*COPIER, "check-update", "--quiet"], [*COPIER, "update", "--defaults"]

    # A project of this build is up to date for all three.
    assert sh(check, ours, check=False, HOME=str(home)).returncode == 0
    sh(update, ours, HOME=str(home))
    assert changed_paths(ours) == set()
    assert "is already up to date" in sh([*DDP_NEW, "update", ours], tmp_path, **env).stdout
    # A project of the release updates to this build (ddp-new update renders the bundle's HEAD).
    assert sh(check, released, check=False, HOME=str(home)).returncode == 2
    sh(update, released, HOME=str(home))
    assert answers(released)["_commit"] == version and (released / "notes.txt").read_text() == NOTES_V1

    # The checkout moves on and ddp-new is rebuilt: the new history lacks the old build's tag, but
    # resolves the name a project recorded, and plain copier moves to the new build.
    (checkout / "template" / "notes.txt").write_text(NOTES_V2)
    commit_all(checkout, "Another template change")
    newer, _ = build_bundle(checkout, bundle)
    assert newer.startswith(f"{NEW}.post3+git-g"), newer
    assert sh(check, ours, check=False, HOME=str(home)).returncode == 2
    sh(update, ours, HOME=str(home))
    assert answers(ours)["_commit"] == newer and (ours / "notes.txt").read_text() == NOTES_V2


def test_plain_copier_on_a_project_of_this_checkout(tmp_path: Path) -> None:
    """How the README installs ddp-new (from this checkout, whatever its commit and tags)."""
    sh([*DDP_NEW, "demo", "-y", "--git"], tmp_path)
    project = tmp_path / "demo"
    assert sh([*COPIER, "check-update", "--quiet"], project, check=False).returncode == 0
    sh([*COPIER, "update", "--defaults"], project)
    assert changed_paths(project) == set()


def from_releases() -> list:
    """(release, tool): ddp-new update from every release; plain copier from the first (its
    migrations) and the newest. The first release is in the quick suite."""
    versions = list(read_record(REPO))
    pairs = [(v, "ddp-new") for v in versions] + [(versions[0], "copier"), (versions[-1], "copier")]
    return [pytest.param(v, tool, marks=[] if v == versions[0] else [pytest.mark.slow]) for v, tool in pairs]


@pytest.mark.parametrize(("release", "tool"), from_releases())
def test_update_from_a_release_touches_only_what_changed(release: str, tool: str, tmp_path: Path) -> None:
    """A project of each release, one unrelated file edited: the update is clean, whatever the
    template renamed or migrated since (0.1.0's configs/default.toml is now example.toml)."""
    if sh(["git", "cat-file", "-t", read_record(REPO)[release]], REPO, check=False).returncode:
        pytest.skip(f"release {release} is not in this clone's history")
    sh([*DDP_NEW, "demo", "-y", "--git", "--vcs-ref", f"v{release}"], tmp_path)
    project = tmp_path / "demo"
    model = project / "src" / "demo" / "model.py"  # an edit away from the template's changes
    edit = "        super().__init__()\n"
    model.write_text(model.read_text().replace(edit, edit + "        # user edit: keep me\n", 1))
    commit_all(project, "User edit")
    update = [*DDP_NEW, "update"] if tool == "ddp-new" else [*COPIER, "update", "--defaults", "--trust"]
    proc = sh(update, project, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git(project, "diff", "--name-only", "--diff-filter=U") == ""
    marked = [p for p in project.rglob("*") if ".git" not in p.parts and p.is_file() and _has_marker(p)]
    assert marked == []
    assert "        super().__init__()\n        # user edit: keep me\n" in model.read_text()
    assert (project / "configs" / "example.toml").is_file() and not (
        project / "configs" / "default.toml"
    ).exists()
    if tool == "ddp-new":  # the CHANGELOG.md entries of every release since the project's
        versions = list(read_record(REPO))
        newer = versions[versions.index(release) + 1 :]
        assert all(f"\n## {v} (" in proc.stdout for v in newer), proc.stdout
        assert f"## {release} (" not in proc.stdout


def test_a_release_record_that_contradicts_a_tag_is_refused(untagged_repo: Path, tmp_path: Path) -> None:
    from generator.errors import GeneratorError
    from generator.releases import build_bundle

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(untagged_repo), str(clone))
    git(clone, "tag", NEW, "HEAD~2")  # the record says NEW is HEAD~1
    with pytest.raises(GeneratorError, match=f"tag {NEW} points at .* but releases.toml records"):
        build_bundle(clone, tmp_path / "b.bundle")


def test_update_without_git_is_one_line(project: Path) -> None:
    proc = sh([*DDP_NEW, "update", project], project.parent, check=False, PATH="/nonexistent")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == "error: git is not installed; ddp-new needs it"


# ---------------------------------------------------------------- one update at a time
def test_an_update_while_another_runs_is_refused(project: Path) -> None:
    from generator.lock import claim
    from generator.update import LOCK

    lock = project / ".git" / LOCK
    with claim(lock, f"updating {project}"):  # as a running `ddp-new update` holds it
        proc = sh([*DDP_NEW, "update", project], project.parent, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (
        f"error: another ddp-new (process {os.getpid()}) is updating {project} right now"
        f" (lock {lock}); wait for it to finish\n"
    )
    assert changed_paths(project) == set() and not lock.exists()


def test_two_updates_at_once_give_one_update(project: Path) -> None:
    """Started together with different answers, one update wins and the other changes nothing:
    the answers file and the files agree (the tools and the profiler are never mixed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [*DDP_NEW, "update", project, "--data", f"features={features}"],
            cwd=project.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for features in ("tools", "profiler")
    ]
    results = [(proc.wait(timeout=300), proc.stderr.read()) for proc in procs]
    for proc in procs:
        proc.stdout.close()
        proc.stderr.close()
    assert sorted(status for status, _ in results) == [0, 2], results
    loser = next(err for status, err in results if status == 2)
    assert "is updating" in loser or "uncommitted" in loser, loser  # refused while, or after, the winner ran
    features = answers(project)["features"]
    package = project / "src" / "demo"
    assert (package / "tools" / "doctor.py").is_file() == (features == ["tools"]), features
    assert (package / "engine" / "profiling.py").is_file() == (features == ["profiler"]), features
    assert not [path for path in changed_paths(project) if "lock" in path]
    assert not (project / ".git" / "ddp-new-update.lock").exists()


def test_a_lock_left_by_a_killed_update_does_not_block(project: Path) -> None:
    from generator.update import LOCK

    lock = project / ".git" / LOCK
    hold = (
        "import pathlib, sys\n"
        "from generator.lock import claim\n"
        "with claim(pathlib.Path(sys.argv[1]), 'updating'):\n"
        "    print('held', flush=True)\n"
        "    input()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, lock], env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    holder.kill()  # as a kill -9 or a power cut: the file stays, with the dead process's id
    holder.wait()
    holder.stdin.close()
    holder.stdout.close()
    assert lock.read_text() == f"{holder.pid}\n"
    sh([*DDP_NEW, "update", project], project.parent)
    assert_updated(project)
    assert not lock.exists()


# ---------------------------------------------------------------- what a broken project is told
def test_update_in_a_folder_of_the_project_updates_the_project(project: Path) -> None:
    proc = sh([*DDP_NEW, "update"], project / "src" / "demo")
    assert f"Updated {project} from template {OLD} to {NEW}" in proc.stdout
    assert_updated(project)


def test_a_folder_of_a_repository_without_a_project_is_named(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q")
    proc = sh([*DDP_NEW, "update"], repo / "src", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {repo / 'src'} has no .copier-answers.yml nor in a folder above it up to {repo};"
        " it was not rendered from a copier template\n"
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", " has no _src_path, the template the project was rendered from; restore it"),
        ("_src_path:\n", " has no _src_path, the template the project was rendered from; restore it"),
        ("_src_path: /nonexistent/template\n", ": _src_path /nonexistent/template does not exist; set it"),
    ],
    ids=["missing", "empty", "gone"],
)
def test_a_broken_src_path_is_named_with_the_fix(project: Path, line: str, message: str) -> None:
    path = project / ".copier-answers.yml"
    kept = [row for row in path.read_text().splitlines(keepends=True) if not row.startswith("_src_path:")]
    path.write_text("".join(kept) + line)
    commit_all(project, "A broken answers file")
    proc = sh([*DDP_NEW, "update", project], project.parent, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {path}{message}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert changed_paths(project) == set()


@pytest.mark.parametrize(
    ("commit", "status", "message"),
    [
        (
            "v9.bogus",
            2,
            "_commit v9.bogus is not a release of ddp-new's template; set it back to the version",
        ),
        ("v99.0.0", 1, "was rendered from template v99.0.0, newer than this ddp-new"),
    ],
)
def test_a_commit_that_is_not_a_release_is_named(
    template_repo: Path, tmp_path: Path, commit: str, status: int, message: str
) -> None:
    bundle = make_bundle(template_repo, NEW, tmp_path / "b.bundle")
    sh([*DDP_NEW, "demo", "-y", "--git"], tmp_path, DDP_NEW_BUNDLE=str(bundle))
    project = tmp_path / "demo"
    path = project / ".copier-answers.yml"
    path.write_text(path.read_text().replace(f"_commit: {NEW}", f"_commit: {commit}"))
    commit_all(project, "A hand-edited version")
    proc = sh([*DDP_NEW, "update", project], tmp_path, check=False, DDP_NEW_BUNDLE=str(bundle))
    assert proc.returncode == status, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert ("upgrade ddp-new" in proc.stderr) == (status == 1), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert changed_paths(project) == set()


# ---------------------------------------------------------------- features (optional capabilities)
ALL_FEATURES = ["fsdp", "comm_hooks", "tools", "profiler"]
TOOLS = ("doctor.py", "plot.py", "check_sync.py")  # in tools/ since 0.9.0, at the top before


def project_files(project: Path) -> set[str]:
    return {str(p.relative_to(project)) for p in project.rglob("*") if ".git" not in p.parts and p.is_file()}


@pytest.fixture(scope="module")
def this_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(bundle, repository): this checkout's history with the template on disk committed on top,
    as the next release would ship it (the template may be ahead of HEAD while it is worked on)."""
    from generator.releases import build_bundle

    root = tmp_path_factory.mktemp("this-tree")
    clone = root / "ddp-new"
    git(root, "clone", "-q", "--no-tags", str(REPO), str(clone))
    (clone / "copier.yml").unlink()
    shutil.rmtree(clone / "template")
    shutil.copy2(REPO / "copier.yml", clone / "copier.yml")
    shutil.copytree(REPO / "template", clone / "template", ignore=shutil.ignore_patterns("__pycache__"))
    for script in ("migrate_example_toml.py", "migrate_engine.py"):  # copier.yml's migrations
        shutil.copy2(REPO / "generator" / script, clone / "generator")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "--allow-empty", "-m", "The template on disk")
    bundle = root / "history.bundle"
    build_bundle(clone, bundle)
    return bundle, clone


def render_files(bundle: Path, root: Path, features: list[str]) -> set[str]:
    """The files of a project with these features, rendered from the template on disk."""
    (root / "home").mkdir()
    sh([*DDP_NEW, "demo", "-y", "--data", f"features={','.join(features)}"], root,
       HOME=str(root / "home"), DDP_NEW_BUNDLE=str(bundle))  # fmt: skip
    return project_files(root / "demo")


@pytest.fixture(scope="module")
def every_capability(this_tree: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return render_files(this_tree[0], tmp_path_factory.mktemp("every-capability"), ALL_FEATURES)


@pytest.fixture(scope="module")
def lean_core(this_tree: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return render_files(this_tree[0], tmp_path_factory.mktemp("lean-core"), [])


def before_features(repo: Path) -> str | None:
    """The last commit before copier.yml got the features question (None: not in this history)."""
    added = git(repo, "log", "--format=%H", "-G", "^features:", "--", "copier.yml").split()
    if not added:
        return None
    parent = sh(["git", "rev-parse", "-q", "--verify", f"{added[-1]}^"], repo, check=False)
    return parent.stdout.strip() or None


# 0.1.0 to 0.3.x had none of the capabilities; 0.4.x, the last version without the features
# question ("before features"), had all four as part of its core.
@pytest.mark.parametrize(
    ("source", "tool", "had"),
    [
        ("0.1.0", "ddp-new", []),
        ("before features", "copier", ALL_FEATURES),
        pytest.param("0.3.0", "copier", [], marks=pytest.mark.slow),
        pytest.param("0.4.0", "ddp-new", ALL_FEATURES, marks=pytest.mark.slow),
        pytest.param("before features", "ddp-new", ALL_FEATURES, marks=pytest.mark.slow),
    ],
)
def test_a_project_from_before_features_keeps_the_capabilities_it_had(
    source: str,
    tool: str,
    had: list[str],
    this_tree: tuple[Path, Path],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """A project rendered before the features question existed gets, on an update by ddp-new or
    by plain `copier update --defaults`, the capabilities its version had: it records them and
    has their files, and no file of a capability its version lacked."""
    bundle, repo = this_tree
    commit = read_record(REPO)[source] if source[0].isdigit() else before_features(repo)
    if commit is None or sh(["git", "cat-file", "-t", commit], repo, check=False).returncode:
        pytest.skip(f"{source} is not in this clone's history")
    expected = request.getfixturevalue("every_capability" if had else "lean_core")
    ref = f"v{source}" if source[0].isdigit() else commit
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "DDP_NEW_BUNDLE": str(bundle)}
    sh([*DDP_NEW, "demo", "-y", "--git", "--vcs-ref", ref], tmp_path, **env)
    project = tmp_path / "demo"
    assert "features" not in answers(project)
    tools = {f"src/demo/{name}" for name in TOOLS}
    assert (tools <= project_files(project)) == bool(had)  # what its version had
    model = project / "src" / "demo" / "model.py"  # an edit away from the template's changes
    edit = "        super().__init__()\n"
    model.write_text(model.read_text().replace(edit, edit + "        # user edit: keep me\n", 1))
    commit_all(project, "User edit")

    # --trust: copier runs the template's migrations (0.9.0's carries edits of moved files) only then
    update = [*DDP_NEW, "update"] if tool == "ddp-new" else [*COPIER, "update", "--defaults", "--trust"]
    proc = sh(update, project, check=False, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert answers(project)["features"] == had
    after = project_files(project)
    # Every file of the capabilities it had, none of those it lacked; of its files, only those
    # the template no longer has at all are gone (moved: sharded.py became fsdp.py), as in any
    # update.
    assert after == expected, sorted(after ^ expected)
    optional = {"src/demo/engine/fsdp.py", "src/demo/engine/profiling.py"}
    optional |= {f"src/demo/tools/{name}" for name in TOOLS}
    assert (optional <= after) if had else not (optional & after), sorted(optional & after)
    assert git(project, "diff", "--name-only", "--diff-filter=U") == ""
    assert [p for p in after if _has_marker(project / p)] == []
    assert "        super().__init__()\n        # user edit: keep me\n" in model.read_text()


def test_update_adds_and_drops_a_capability(template_repo: Path, tmp_path: Path) -> None:
    """A lean project takes tools and the profiler by `--data features=...`, then drops them: the
    unedited files go, an edited one stays and is reported."""
    sh([*DDP_NEW, "demo", "-y", "--git", "--template", template_repo], tmp_path)
    project = tmp_path / "demo"
    package = project / "src" / "demo"
    optional = [package / "tools" / name for name in TOOLS] + [package / "engine" / "profiling.py"]
    assert answers(project)["features"] == [] and "strategy" not in answers(project)
    assert [path for path in optional if path.exists()] == []

    # strategy is asked only with fsdp: an answer to it alone would not be recorded.
    proc = sh([*DDP_NEW, "update", project, "--data", "strategy=fsdp"], tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--data strategy: the question is asked only when 'fsdp' in features" in proc.stderr
    assert changed_paths(project) == set()

    proc = sh([*DDP_NEW, "update", project, "--data", "features=tools,profiler"], tmp_path)
    assert answers(project)["features"] == ["tools", "profiler"]
    for path in optional:
        assert path.is_file() and f"added    {path.relative_to(project)}\n" in proc.stdout, proc.stdout
    commit_all(project, "Tools and the profiler")
    doctor = package / "tools" / "doctor.py"
    doctor.write_text(doctor.read_text() + "# my own check\n")
    commit_all(project, "My own doctor check")

    proc = sh([*DDP_NEW, "update", project, "--data", "features="], tmp_path, check=False)  # none
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert answers(project)["features"] == []
    assert doctor.read_text().endswith("# my own check\n")
    assert (
        "conflict src/demo/tools/doctor.py  (your new answers or the new template dropped this file,"
        " which you had changed: your version is kept" in proc.stderr
    ), proc.stderr
    assert "src/demo/tools/doctor.py" not in proc.stdout
    for path in optional[1:]:
        assert not path.exists() and f"removed  {path.relative_to(project)}\n" in proc.stdout, proc.stdout
