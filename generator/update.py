"""`ddp-new update`: pull template changes into a project, keep the user's edits, never hide a conflict.

copier does the three-way merge. This module adds what copier leaves to the user: refusing
a dirty or non-git project up front, pointing copier at this installation's template
history, reporting conflicts (copier exits 0 even when it leaves conflict markers), and
keeping files that the user changed but the new template, or the new answers, no longer
have (copier deletes them).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from generator import __version__
from generator.errors import EXIT_FAILED, GeneratorError, copier_errors
from generator.git import git
from generator.lock import claim
from generator.project import ANSWERS, check_clean_git, check_source, git_dir, read_answers
from generator.templates import LINK, packaged_bundle, pick_ref, point_link_at

# In the project's git directory: git never shows it there, so it is never committed, and a
# work tree with it is still clean for the next update's check.
LOCK = "ddp-new-update.lock"
RELEASE = re.compile(r"^v(\d+\.\d+\.\d+)")  # a release, or a commit after one: v0.5.0.post7+git-g...
MARKER = re.compile(r"^<<<<<<< before updating$", re.MULTILINE)  # copier's inline conflict


@dataclass
class UpdateReport:
    old_version: str
    new_version: str
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # merge conflicts: <<<<<<< markers or .rej
    kept: list[str] = field(default_factory=list)  # changed by the user, dropped by the template

    @property
    def up_to_date(self) -> bool:
        return not (self.added or self.changed or self.removed or self.conflicts or self.kept)


def update(
    project: Path, data: dict[str, Any], *, vcs_ref: str | None = None, trust: bool = False
) -> UpdateReport:
    """Update `project` to the template of this installation (or `vcs_ref`); one update of a
    project at a time: a second one is refused while the first holds the lock."""
    project = project.resolve()
    answers = read_answers(project)
    check_source(project, answers["_src_path"])
    with claim(git_dir(project) / LOCK, f"updating {project}"):
        return _update(project, answers, data, vcs_ref=vcs_ref, trust=trust)


def _update(
    project: Path, answers: dict[str, Any], data: dict[str, Any], *, vcs_ref: str | None, trust: bool
) -> UpdateReport:
    check_clean_git(project)
    src = answers["_src_path"]
    if src == LINK:  # rendered from a ddp-new bundle: make the link lead to ours
        bundle = packaged_bundle()
        if bundle is None:
            raise GeneratorError(
                "this ddp-new was built without its template history, so it cannot update projects;"
                " install a release wheel",
                exit_code=EXIT_FAILED,
            )
        point_link_at(bundle)
        vcs_ref = vcs_ref or pick_ref(bundle)
        trust = True  # the template shipped with ddp-new itself; its migrations are ours
    old_version = str(answers.get("_commit", "?"))
    _run_update(project, data, vcs_ref=vcs_ref, trust=trust, old_version=old_version, src=src)
    report = _report(project, old_version)
    if report.removed:
        _keep_user_changed(project, answers, report, trust=trust)
    return report


def _run_update(
    project: Path, data: dict[str, Any], *, vcs_ref: str | None, trust: bool, old_version: str, src: str
) -> None:
    import copier

    with copier_errors("update", vcs_ref):
        try:
            copier.run_update(
                project,
                data=data,
                defaults=True,
                overwrite=True,
                conflict="inline",
                vcs_ref=vcs_ref,
                unsafe=trust,
                quiet=True,
            )
        except ValueError as error:  # a revision that is not --vcs-ref's: the project's own version
            if str(error).startswith("Unknown revision") and str(error) != f"Unknown revision: {vcs_ref!r}":
                raise _unknown_version(project, old_version, src) from None
            raise


def _unknown_version(project: Path, commit: str, src: str) -> GeneratorError:
    """The project's recorded _commit is not in the template's history."""
    release = RELEASE.match(commit)
    if src == LINK and release and _numbers(release.group(1)) > _numbers(__version__):
        return GeneratorError(
            f"{project} was rendered from template {commit}, newer than this ddp-new"
            f" ({__version__}); upgrade ddp-new (pip install -U ddp-new)",
            exit_code=EXIT_FAILED,
        )
    what = "a release of ddp-new's template" if src == LINK else f"a version of the template {src}"
    return GeneratorError(
        f"{project / ANSWERS}: _commit {commit} is not {what}; set it back to the version the"
        f" project was rendered from (git log -p {ANSWERS} shows it), commit, and run the update again"
    )


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _report(project: Path, old_version: str) -> UpdateReport:
    new_version = str(read_answers(project).get("_commit", "?"))
    report = UpdateReport(old_version, new_version)
    # --no-renames: git would pair a deleted file with a similar new or conflicted one and
    # report the pair as one path, hiding the deletion (a user's own configs/example.toml
    # beside the configs/default.toml the template dropped).
    unmerged = set(git(project, "diff", "--no-renames", "--name-only", "--diff-filter=U").splitlines())
    status = git(project, "status", "--porcelain", "--no-renames", "--untracked-files=all")
    for line in status.splitlines():
        code, path = line[:2], line[3:].strip('"')
        if path.endswith(".rej") or path in unmerged or _has_marker(project / path):
            report.conflicts.append(path)
        elif code == "??" or "A" in code:
            report.added.append(path)
        elif "D" in code:
            report.removed.append(path)  # " D": deleted by copier; "D ": moved by a migration
        else:
            report.changed.append(path)
    return report


def _has_marker(path: Path) -> bool:
    try:
        return bool(MARKER.search(path.read_text(encoding="utf-8", errors="ignore")))
    except (IsADirectoryError, FileNotFoundError):
        return False


def _keep_user_changed(project: Path, answers: dict[str, Any], report: UpdateReport, *, trust: bool) -> None:
    """Restore files that the update deleted although the user had changed them; report them.

    copier deletes every file the old render had and the new one has not, edited or not: a
    file the new template dropped, or one of a capability dropped from `features` by --data.
    A file that differs from what the old template rendered holds the user's work: it is
    restored as committed, and reported like a conflict, for the user to move or delete.
    (A migration's `git mv` is a staged deletion: the user's file moved, nothing to restore.)
    """
    unstaged = set(git(project, "diff", "--no-renames", "--name-only", "--diff-filter=D").splitlines())
    deleted = [path for path in report.removed if path in unstaged]
    if not deleted:
        return
    with tempfile.TemporaryDirectory(prefix="ddp-new-old-render.") as tmp:
        old = Path(tmp) / project.name
        rendered = _render_old(answers, old, trust=trust)  # None: cannot tell, keep them all
        for path in deleted:
            if rendered and (old / path).is_file():
                as_rendered = git(project, "hash-object", "--no-filters", str(old / path)).strip()
                if as_rendered == git(project, "rev-parse", f"HEAD:{path}").strip():
                    continue  # unchanged since the render: the template may delete it
            git(project, "checkout", "HEAD", "--", path)
            report.removed.remove(path)
            report.kept.append(path)


def _render_old(answers: dict[str, Any], dst: Path, *, trust: bool) -> Path | None:
    """Render the project's template version again, with its answers, into `dst` (None: failed)."""
    import copier

    data = {key: value for key, value in answers.items() if not key.startswith("_")}
    try:
        copier.run_copy(
            str(answers["_src_path"]),
            dst,
            data=data,
            vcs_ref=str(answers["_commit"]),
            defaults=True,
            overwrite=True,
            quiet=True,
            unsafe=trust,
            skip_tasks=True,
        )
    except Exception:  # any failure: no deletion can be judged safe
        return None
    return dst
