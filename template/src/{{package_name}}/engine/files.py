"""Writing files so that a crash, a full disk or a second run never leaves a half-written one,
and knowing a file's content again: the one fingerprint that the data caches keep.

A file is written under a temporary name of this process's own (temp_path), flushed to disk,
then renamed over the final name: readers see the old file or the whole new one, never part.

A cache records each input file's sha256 with its stat_of (size, mtime, ctime, inode). A file
whose stat_of is as recorded is not read again: any write sets its ctime, which cp -p, rsync -a,
tar x and touch -r cannot set back. Any other file is hashed again (unchanged_content).
"""

import hashlib
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import lock
from .config import ConfigError

STAT = ("size", "mtime_ns", "ctime_ns", "inode")  # what a write or a replacement changes
CHUNK = 1 << 22  # bytes hashed at a time
WAIT_S = 0.2  # how often a process that waits for a cache's lock looks again

Stop = Callable[[], bool]  # whether a stop was requested (SIGTERM, Ctrl-C)


class Stopped(Exception):
    """A stop was requested while a file was read, or while a conversion was awaited."""


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


def stray_temps(directory: Path) -> list[Path]:
    """The temporary files (temp_path) in `directory` whose writer on this host is gone: left by
    a process that was killed. Another host's, or a live process's, are left alone."""
    pattern = re.compile(rf"\.{re.escape(socket.gethostname())}\.(\d+)\.tmp$")
    found = []
    for path in directory.iterdir() if directory.is_dir() else []:
        match = pattern.search(path.name)
        if match and not lock.pid_exists(int(match[1])):
            found.append(path)
    return found


def stat_of(file: Path | int) -> dict[str, int]:
    """What a write to a file (a path, or an open file's descriptor) or its replacement changes:
    a write sets the ctime to now, and nothing but the kernel sets the ctime. OSError if none."""
    stat = os.stat(file)
    values = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    return dict(zip(STAT, values, strict=True))


def sha256_of(file: Path, stop: Stop = lambda: False) -> str:
    """The sha256 of a file's bytes, read CHUNK bytes at a time; Stopped once `stop()` is true."""
    digest = hashlib.sha256()
    with open(file, "rb") as src:
        while chunk := src.read(CHUNK):
            if stop():
                raise Stopped
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(digests: dict[Path, str], source: Path) -> str:
    """sha256 of a file's or a directory's content: the file's own, or for a directory, the
    sha256 of the lines "<sha256 of the file>  <its path in the directory>" of its files."""
    if not source.is_dir():
        return digests[source]
    lines = (f"{d}  {f.relative_to(source).as_posix()}\n" for f, d in digests.items())
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def entry(file: Path, sha256: str, stat: dict[str, int]) -> dict[str, Any]:
    """What a cache records about one input file: its path, sha256 and stat_of."""
    return {"path": str(file.resolve()), "sha256": sha256, **stat}


def changed_stats(files: list[Path], entries: list[dict[str, Any]]) -> list[int]:
    """The indices of the files whose stat_of is not the one recorded in their entry."""
    return [i for i, (f, e) in enumerate(zip(files, entries, strict=True)) if not same_stat(f, e)]


def same_stat(file: Path, recorded: dict[str, Any]) -> bool:
    try:
        return stat_of(file) == {key: recorded[key] for key in STAT}
    except OSError:
        return False


def unchanged_content(files: list[Path], entries: list[dict[str, Any]], stop: Stop) -> bool:
    """Whether `files` hold what their entries recorded: those whose stat_of changed are hashed;
    if the same, their entries get the new stat_of (the next check reads none). OSError if one
    cannot be read."""
    for i in changed_stats(files, entries):
        now = stat_of(files[i])  # before reading: a write meanwhile shows at the next check
        if sha256_of(files[i], stop) != entries[i]["sha256"]:
            return False
        entries[i].update(now)
    return True


def wait_turn(held: lock.LockFile, doing: str, stop: Stop = lambda: False) -> None:
    """Take `held`, waiting while another process holds it (`doing`: what it does), which a
    node's local rank 0 says once. ConfigError naming the holder if a live one shows no
    heartbeat for lock.STALE_AFTER_S (stopped with SIGSTOP or Ctrl-Z, say); Stopped once
    `stop()` is true. OSError if the lock cannot be taken."""
    told = os.environ.get("LOCAL_RANK", "0") != "0"
    while (found := held.take()) is not None:
        holder, age = found
        if stop():
            raise Stopped
        if age > lock.STALE_AFTER_S:
            pid = (holder or {}).get("pid", "?")
            raise ConfigError(
                f"gave up waiting for {held.path} ({lock.describe(holder)}): its holder, which"
                f" {doing}, is alive but has shown no heartbeat for {age:.0f} s (stopped? kill"
                f" -CONT {pid}); let it go on or end it, then run again"
            )
        if not told and not of_this_job(holder):  # a job's own ranks wait for it quietly
            print(waiting_line(held.path, holder, doing), flush=True)
            told = True
        time.sleep(WAIT_S)


def of_this_job(holder: dict[str, Any] | None) -> bool:
    """Whether a lock's holder is a rank of this torchrun job."""
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    return job is not None and bool(holder) and holder.get("torchelastic_run_id") == job


def waiting_line(path: Path, holder: dict[str, Any] | None, doing: str) -> str:
    """What a process says, once, when it finds the lock `path` held."""
    if holder == {}:
        until = f"taken over once it is {lock.DAMAGED_AFTER_S:.0f} s old"
    else:
        until = (
            f"taken over once its process is gone, or {lock.STALE_AFTER_S:.0f} s without a"
            " heartbeat (an error instead if it is alive on this host)"
        )
    return (
        f"data: waiting for {path} ({lock.describe(holder)}), held while another run {doing};"
        f" {until}. Ctrl-C stops waiting"
    )
