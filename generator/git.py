"""The one way ddp-new runs git: captured output, and one-line errors instead of tracebacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

from generator.errors import EXIT_FAILED, GeneratorError


def git(cwd: Path | str, *args: str, check: bool = True) -> str:
    """Run `git ARGS` in `cwd` and return its stdout; raise GeneratorError when it fails.

    With check=False a failure returns "" instead (for questions such as "is this a work tree").
    """
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise GeneratorError("git is not installed; ddp-new needs it", exit_code=EXIT_FAILED) from None
    except NotADirectoryError:
        raise GeneratorError(f"{cwd} is not a directory") from None
    if proc.returncode != 0:
        if not check:
            return ""
        detail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise GeneratorError(f"git {args[0]} failed in {cwd}: {detail}", exit_code=EXIT_FAILED)
    return proc.stdout
