"""The project that `ddp-new update` works on: where it is, its answers file, its git work tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from generator.errors import GeneratorError
from generator.git import git
from generator.templates import LINK

ANSWERS = ".copier-answers.yml"


def find_project(path: Path) -> Path:
    """The project that `path` is in: `path`, or the nearest folder above it with the answers
    file, up to the top of its git work tree (so `ddp-new update` works in src/ as git does)."""
    start = path.resolve()
    if not start.is_dir():
        raise GeneratorError(f"{path} is not a directory")
    top = git(start, "rev-parse", "--show-toplevel", check=False).strip()
    if not top:  # not in git: the project must be `path` itself
        top = str(start)
    for folder in (start, *start.parents):
        if (folder / ANSWERS).is_file():
            return folder
        if folder == Path(top).resolve():
            break
    above = f" nor in a folder above it up to {top}" if Path(top).resolve() != start else ""
    raise GeneratorError(f"{start} has no {ANSWERS}{above}; it was not rendered from a copier template")


def read_answers(project: Path) -> dict[str, Any]:
    from generator.questions import load_yaml

    path = project / ANSWERS
    if not path.is_file():
        raise GeneratorError(f"{project} has no {ANSWERS}; it was not rendered from a copier template")
    try:
        answers = load_yaml(path.read_text(encoding="utf-8"), source=str(path))
    except (OSError, UnicodeDecodeError) as error:
        raise GeneratorError(f"cannot read {path}: {error}") from None
    src = answers.get("_src_path") if isinstance(answers, dict) else None
    if not isinstance(src, str) or not src.strip():
        raise GeneratorError(
            f"{path} has no _src_path, the template the project was rendered from; restore it from the"
            f" project's history (git log -p {ANSWERS}), or for ddp-new's template add the line"
            f" '_src_path: {LINK}'"
        )
    return answers


def check_source(project: Path, src: str) -> None:
    """Refuse a recorded local template that is not there (copier: "must be a directory")."""
    path = Path(src).expanduser()
    if src == LINK or "://" in src or src.startswith(("git@", "gh:", "gl:")) or not path.is_absolute():
        return  # ddp-new's own (update() makes the link), a URL, or relative: copier resolves it
    if not path.exists():
        raise GeneratorError(
            f"{project / ANSWERS}: _src_path {src} does not exist; set it to where the project's"
            f" template is now (ddp-new's own: {LINK}), commit, and run the update again"
        )


def git_dir(project: Path) -> Path:
    """The project's git directory; refuse a project that is not a git work tree."""
    if not project.is_dir():
        raise GeneratorError(f"{project} is not a directory")
    found = git(project, "rev-parse", "--absolute-git-dir", check=False).strip()
    inside = git(project, "rev-parse", "--is-inside-work-tree", check=False).strip() == "true"
    if not (found and inside):
        raise GeneratorError(
            f"{project} is not a git repository; updating needs one to merge safely:"
            " git init && git add -A && git commit -m 'Initial commit'"
        )
    return Path(found)


def check_clean_git(project: Path) -> None:
    """Refuse a project that has uncommitted or untracked files."""
    dirty = git(project, "status", "--porcelain", "--untracked-files=all").splitlines()
    if dirty:
        raise GeneratorError(
            f"{project} has {len(dirty)} uncommitted or untracked file(s), e.g. {dirty[0][3:]};"
            " commit or stash them first so the update can be reviewed and undone"
        )
