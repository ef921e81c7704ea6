"""Writing files so that a crash, a full disk or a second run never leaves a half-written one.

A file is written under a temporary name of this process's own (temp_path), flushed to disk,
then renamed over the final name: readers see the old file or the whole new one, never part.
"""

import os
import shutil
import socket
from pathlib import Path
from typing import Any

import torch


def temp_path(path: Path) -> Path:
    """Where this process writes `path` before renaming it: a name of its own (host and pid),
    so a run that lost OUT_DIR/run.lock and the run that took it over never share a file."""
    return path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def write_atomic(state: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file, then rename: a crash never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)  # atomic: readers see the old name or the complete new file
    except BaseException:  # a full disk, say: leave no partial file behind
        remove(tmp)
        raise
    if os.name == "posix":  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        os.fsync(directory)
        os.close(directory)


def remove(path: Path) -> None:
    """Delete a file or a directory if it exists. Cleaning up is best effort: a
    file that cannot be deleted (a read-only directory) stays, and the run goes on."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def os_error_text(err: BaseException) -> str:
    """'No space left on device' for a full disk: torch.save raises RuntimeError, whose cause
    or context is the OSError of the write itself."""
    found = os_error(err)
    if found:
        return found.strerror
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def os_error(err: BaseException) -> OSError | None:
    """The OSError behind `err` (itself, or its cause or context, at any depth), if any."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
