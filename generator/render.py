"""Render a copier template into a new project directory, all or nothing.

The project is rendered into a hidden temporary directory and moved into place only when
rendering succeeded, so a failure or Ctrl-C leaves the target as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from generator.errors import EXIT_FAILED, GeneratorError, copier_errors
from generator.lock import claim

WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL"} | {f"{p}{i}" for p in ("COM", "LPT") for i in range(1, 10)}


def check_name(name: str) -> None:
    """Refuse a project name that cannot safely be a directory name on every platform."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise GeneratorError(f"project name {name!r} is not valid UTF-8") from None
    if not name.strip():
        raise GeneratorError("project name is empty")
    if "\0" in name:
        raise GeneratorError("project name contains a NUL character")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise GeneratorError(
            f"project name {name!r} is a path; give a plain name and put the directory"
            " elsewhere with --dest PATH"
        )
    if len(name) > 64:
        raise GeneratorError(f"project name is {len(name)} characters long; the limit is 64")
    if name.split(".")[0].upper() in WINDOWS_RESERVED:
        raise GeneratorError(f"project name {name!r} is a reserved device name on Windows")


def resolve_target(path: Path) -> Path:
    """The absolute target; a symbolic link to a directory stands for that directory."""
    target = path.expanduser().absolute()
    if target.is_symlink() and target.is_dir():
        return target.resolve()
    return target


def check_target(target: Path, force: bool) -> None:
    """Refuse a target that exists and is not an empty directory, unless forced."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise GeneratorError(f"{target} exists and is not a directory")
    if target.is_dir():
        if _own_entries(target) and not force:
            raise GeneratorError(f"{target} exists and is not empty; pass --force to render into it")
        _check_writable(target)
        return
    if not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not exist"
        raise GeneratorError(f"{target.parent} {what}; create the directory first")
    _check_writable(target.parent)


def _check_writable(directory: Path) -> None:
    if os.access(directory, os.W_OK | os.X_OK):
        return
    read_only = hasattr(os, "statvfs") and os.statvfs(directory).f_flag & os.ST_RDONLY
    why = "it is on a read-only file system" if read_only else "permission denied"
    raise GeneratorError(f"cannot write to {directory}: {why}; put the project elsewhere (--dest PATH)")


def _own_entries(target: Path) -> list[Path]:
    """The entries of an existing target, without the scratch files of ddp-new renders."""
    return [entry for entry in target.iterdir() if not _is_scratch(entry.name, target.name)]


def _is_scratch(name: str, target_name: str) -> bool:
    return name.startswith(f".{target_name}.") and name.endswith((".ddp-new", ".ddp-new.lock"))


def check_template(src: str) -> str:
    """Return the source to record: a local template as an absolute path; URLs as given.

    A relative path would be recorded in the project's answers and break later updates.
    """
    if "://" in src or src.startswith(("git@", "gh:", "gl:")):
        return src
    path = Path(src).expanduser()
    if not path.exists():
        raise GeneratorError(f"template {src} does not exist")
    if not ((path / "copier.yml").is_file() or (path / "copier.yaml").is_file()):
        raise GeneratorError(f"template {src} is not a copier template (no copier.yml in it)")
    return str(path.resolve())


def render(
    src: str,
    target: Path,
    data: dict[str, Any],
    *,
    defaults: bool,
    force: bool,
    trust: bool = False,
    vcs_ref: str | None = None,
    git: bool = False,
) -> None:
    """Render `src` into `target`; on any failure the target is left as it was.

    A new project is rendered into a hidden scratch directory beside the target and renamed
    into place; an existing (empty, or --force) target holds the scratch directory itself, so
    that files move within one file system, and gets the files one by one, undone on failure.
    A lock held meanwhile makes a second render into the same target fail instead of mixing.
    """
    check_target(target, force)
    scratch = target if target.is_dir() else target.parent
    lock = scratch / f".{target.name}.ddp-new.lock"
    with claim(lock, f"rendering into {target}", "wait for it to finish or choose another name"):
        check_target(target, force)  # again: another render may have finished meanwhile
        for stale in scratch.glob(f".{target.name}.*.ddp-new"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a render that was killed
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".ddp-new", dir=scratch))
        except OSError as error:
            raise GeneratorError(f"cannot write to {scratch}: {error.strerror}") from None
        try:
            _run_copy(src, tmp, data, defaults=defaults, trust=trust, vcs_ref=vcs_ref)
            _check_package(tmp, target)  # a default or typed name, which --data did not check
            if git:
                _git_commit(tmp)
            _publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _run_copy(
    src: str, dst: Path, data: dict[str, Any], *, defaults: bool, trust: bool, vcs_ref: str | None
) -> None:
    """Call copier; its exceptions become one-line GeneratorErrors."""
    import copier
    from copier import errors

    # A template checkout with uncommitted edits (a developer's) is rendered as it is.
    warnings.simplefilter("ignore", errors.DirtyLocalWarning)
    with copier_errors("render", vcs_ref):
        copier.run_copy(
            src,
            dst,
            data=data,
            defaults=defaults,
            unsafe=trust,
            vcs_ref=vcs_ref,
            quiet=True,
            overwrite=True,
        )


def _check_package(tmp: Path, target: Path) -> None:
    """The rendered project's package name must not shadow an importable module."""
    from generator.questions import check_package_name, load_yaml

    answers_file = tmp / ".copier-answers.yml"
    answers = load_yaml(answers_file.read_text(encoding="utf-8")) if answers_file.is_file() else None
    if isinstance(answers, dict) and isinstance(answers.get("package_name"), str):
        check_package_name(answers["package_name"], target)


def _git_commit(project: Path) -> None:
    """Make the rendered project a git repository with one commit: updates need a clean work tree."""
    from generator.git import git

    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "Initial commit"]):
        git(project, *args)


def _publish(tmp: Path, target: Path) -> None:
    """Move the rendered tree into place: one rename for a new target, else file by file."""
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes the directory private; a project should not be
    if not target.exists():
        try:
            os.rename(tmp, target)
        except OSError as error:
            raise GeneratorError(
                f"cannot create {target}: {error.strerror}; nothing was written", exit_code=EXIT_FAILED
            ) from None
        return
    _check_clashes(tmp, target)
    _Merge(target).run(tmp)


def _check_clashes(tmp: Path, target: Path) -> None:
    """Refuse to merge into a target whose entries have another kind than the project's."""
    for root, dirs, files in os.walk(tmp):
        for name in dirs + files:
            new = Path(root, name)
            old = target / new.relative_to(tmp)
            if not (old.exists() or old.is_symlink()):
                continue
            if name in dirs and (old.is_symlink() or not old.is_dir()):
                kind = "a symbolic link" if old.is_symlink() else "a file"
                raise GeneratorError(
                    f"--force: {old} is {kind} where the project has a directory;"
                    " move it away first (nothing was written)"
                )
            if name in files and old.is_dir() and not old.is_symlink():
                raise GeneratorError(
                    f"--force: {old} is a directory where the project has a file;"
                    " move it away first (nothing was written)"
                )


class _Merge:
    """Move a rendered tree into an existing directory; undo every move if one fails."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.created: list[Path] = []  # paths moved into the target, in order
        self.replaced: list[tuple[Path, Path]] = []  # (path in target, its saved original)

    def run(self, tmp: Path) -> None:
        backup = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", suffix=".ddp-new", dir=self.target))
        try:
            self._merge(tmp, self.target, backup)
        except OSError as error:
            self._undo()
            where = error.filename or self.target
            raise GeneratorError(
                f"cannot write {where}: {error.strerror}; {self.target} was left as it was",
                exit_code=EXIT_FAILED,
            ) from None
        finally:
            shutil.rmtree(backup, ignore_errors=True)

    def _merge(self, src_dir: Path, dst_dir: Path, backup: Path) -> None:
        for src in sorted(src_dir.iterdir()):
            dst = dst_dir / src.name
            if src.is_dir() and dst.is_dir():
                self._merge(src, dst, backup / src.name)
                continue
            if dst.exists() or dst.is_symlink():
                backup.mkdir(parents=True, exist_ok=True)
                os.replace(dst, backup / src.name)
                self.replaced.append((dst, backup / src.name))
            os.replace(src, dst)  # a whole new directory moves in one rename
            self.created.append(dst)

    def _undo(self) -> None:
        for path in reversed(self.created):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for path, saved in reversed(self.replaced):
            os.replace(saved, path)
