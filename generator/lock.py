"""The one lock of ddp-new: two commands on one project (two renders into one target, two
updates of one project) must not run at once, or each writes half of the result.

The lock is an flock on a file, which the kernel drops when its process ends, however it ends:
a file left by a killed ddp-new does not block the next one. The file holds the holder's
process id, which the refusal names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from generator.errors import GeneratorError


@contextmanager
def claim(lock: Path, doing: str, advice: str = "wait for it to finish") -> Iterator[None]:
    """Hold the lock file `lock` while `doing` (e.g. "updating DIR"), or refuse in one line:
    another ddp-new is doing it; `advice` says what to do instead."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | (0 if fcntl else os.O_EXCL), 0o644)
        except FileExistsError:  # no fcntl (Windows): the file itself is the lock
            raise _busy(lock, doing, advice) from None
        except OSError as error:
            raise GeneratorError(f"cannot write to {lock.parent}: {error.strerror}") from None
        try:
            if fcntl:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(lock, doing, advice) from None
        # The previous holder may have deleted the file between our open and flock.
        if not lock.exists() or os.stat(lock).st_ino != os.fstat(fd).st_ino:
            os.close(fd)
            continue
        break
    try:
        os.ftruncate(fd, 0)  # a killed holder's id may still be in it
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        lock.unlink(missing_ok=True)  # still holding it: nobody can take the deleted file
        os.close(fd)


def _busy(lock: Path, doing: str, advice: str) -> GeneratorError:
    try:
        holder = f"process {int(lock.read_text(encoding='ascii'))}"
    except (OSError, ValueError):  # not written yet, or gone meanwhile
        holder = "another process"
    return GeneratorError(f"another ddp-new ({holder}) is {doing} right now (lock {lock}); {advice}")
