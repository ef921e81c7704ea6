"""Render a copier template into a new project directory, all or nothing.

The project is rendered into a hidden temporary directory beside the target and moved
into place only when rendering succeeded, so a failure or Ctrl-C leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from generator.errors import EXIT_FAILED, EXIT_UNSAFE, GeneratorError

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


def check_target(target: Path, force: bool) -> None:
    """Refuse a target that exists and is not an empty directory, unless forced."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise GeneratorError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise GeneratorError(f"{target} exists and is not empty; pass --force to render into it")
    if not target.parent.is_dir():
        raise GeneratorError(f"{target.parent} does not exist; create it first")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise GeneratorError(f"cannot write to {target.parent}: permission denied")


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
    """Render `src` into `target`; on any failure nothing is left at or beside `target`."""
    check_target(target, force)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".ddp-new", dir=target.parent))
    except OSError as error:
        raise GeneratorError(f"cannot write to {target.parent}: {error.strerror}") from None
    try:
        _run_copy(src, tmp, data, defaults=defaults, trust=trust, vcs_ref=vcs_ref)
        if git:
            _git_commit(tmp)
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_copy(
    src: str, dst: Path, data: dict[str, Any], *, defaults: bool, trust: bool, vcs_ref: str | None
) -> None:
    """Call copier and turn its exceptions into one-line GeneratorErrors."""
    import copier
    import jinja2
    from copier import errors
    from plumbum import ProcessExecutionError

    # A template checkout with uncommitted edits (a developer's) is rendered as it is.
    warnings.simplefilter("ignore", errors.DirtyLocalWarning)
    try:
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
    except errors.UnsafeTemplateError as error:
        raise GeneratorError(
            f"{error}. Read the template's copier.yml; if you trust it, run again with --trust",
            exit_code=EXIT_UNSAFE,
        ) from None
    except errors.InteractiveSessionError:
        raise GeneratorError(
            "no terminal to ask the questions in; pass --defaults (-y) and --data key=value"
        ) from None
    except ValueError as error:  # copier's validators and choices
        raise GeneratorError(str(error)) from None
    except errors.CopierError as error:
        raise GeneratorError(str(error), exit_code=EXIT_FAILED) from None
    except jinja2.TemplateError as error:
        raise GeneratorError(f"the template failed to render: {error}", exit_code=EXIT_FAILED) from None
    except OSError as error:
        raise GeneratorError(f"cannot write the project: {error}", exit_code=EXIT_FAILED) from None
    except ProcessExecutionError as error:  # git, for a template given as a URL or repository
        detail = (error.stderr or "").strip().splitlines() or [str(error)]
        raise GeneratorError(f"git failed: {detail[-1]}", exit_code=EXIT_FAILED) from None
    except (ArithmeticError, LookupError, TypeError, RuntimeError) as error:  # a template's own bug
        raise GeneratorError(
            f"the template failed to render: {type(error).__name__}: {error}", exit_code=EXIT_FAILED
        ) from None


def _git_commit(project: Path) -> None:
    """Make the rendered project a git repository with one commit: updates need a clean work tree."""
    import subprocess

    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "Initial commit"]):
        try:
            proc = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True)
        except FileNotFoundError:
            raise GeneratorError("--git needs git, which is not installed", exit_code=EXIT_FAILED) from None
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise GeneratorError(f"git {args[0]} failed: {detail}", exit_code=EXIT_FAILED)


def _move_into_place(tmp: Path, target: Path) -> None:
    """Publish the rendered tree: one rename when the target is new or empty."""
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes the directory private; a project should not be
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.replace(tmp, target)
        return
    shutil.copytree(tmp, target, dirs_exist_ok=True)  # --force into a non-empty directory
