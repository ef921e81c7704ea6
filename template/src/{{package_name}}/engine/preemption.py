"""How a run stops: SIGTERM, SIGHUP, Ctrl-C, torchrun's death, a usage error, or a failure.

SIGTERM (SLURM, Kubernetes, torchrun), SIGHUP (a closed terminal or login session) and Ctrl-C
only set a flag: the ranks agree on it (dist.AgreeLater) and stop together at a step boundary,
after rank 0 saved the step. A second Ctrl-C (or a SIGTERM or SIGHUP after one: torchrun passes
a second Ctrl-C on as SIGTERM) stops at once.
"""

import errno
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn, Self, TextIO

import torch.distributed as torch_dist

from . import dist
from .loading import DataError, worker_lost

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


class Interrupted(BaseException):
    """A second Ctrl-C: stop at once. A BaseException, like KeyboardInterrupt: nothing catches it
    by accident on the way out."""


class Preemption:
    """While active, SIGTERM, SIGHUP and SIGINT only set `reason`; so does the death of torchrun
    (a launcher killed with SIGKILL cannot pass a signal on, and its orphaned workers would train
    on beside a rerun): under torchrun a thread sees the worker re-parented."""

    SIGTERM, HANGUP, LAUNCHER_EXITED, INTERRUPT = 1, 2, 3, 4  # the ranks agree on the largest
    WHY = {
        SIGTERM: "SIGTERM",
        HANGUP: "SIGHUP (the terminal or login session closed)",
        LAUNCHER_EXITED: "launcher (torchrun) exited",
        INTERRUPT: "interrupted (Ctrl-C)",
    }
    # 128 + the signal's number, as a shell reports a process that a signal ended
    EXIT_STATUS = {SIGTERM: 143, HANGUP: 129, LAUNCHER_EXITED: 143, INTERRUPT: EXIT_INTERRUPTED}
    REASONS = {signal.SIGTERM: SIGTERM, signal.SIGHUP: HANGUP, signal.SIGINT: INTERRUPT}
    WATCH_EVERY_S = 1.0
    reason = 0
    interrupted = False  # this process got a Ctrl-C: the next signal stops it at once

    @property
    def requested(self) -> bool:
        return self.reason > 0

    def __enter__(self) -> Self:
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.REASONS}
        self._streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = [Terminal(s) if s.isatty() else s for s in self._streams]
        self._done = threading.Event()
        if started_by_torchrun():
            parent = os.getppid()
            threading.Thread(target=self._watch, args=(parent,), daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        sys.stdout, sys.stderr = self._streams

    def _handle(self, signum: int, frame: Any) -> None:
        if self.interrupted:
            raise Interrupted
        if signum == signal.SIGINT:
            self.interrupted = True
        self.reason = max(self.reason, self.REASONS[signum])

    def _watch(self, parent: int) -> None:
        while not self._done.wait(self.WATCH_EVERY_S):
            if os.getppid() != parent:
                self.reason = max(self.reason, self.LAUNCHER_EXITED)
                return


class Terminal:
    """sys.stdout or sys.stderr at a terminal, which may hang up (a closed window or ssh session)
    before its SIGHUP reaches this process. A write then fails with EIO, and would stop the run
    before it saved; instead, what is written from then on goes to /dev/null."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __getattr__(self, name: str) -> Any:  # all but write and flush: the stream's own
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as err:
            self._hung_up(err)
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as err:
            self._hung_up(err)

    def _hung_up(self, err: OSError) -> None:
        if err.errno != errno.EIO:
            raise err
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)
        self.stream.flush()  # what was buffered goes to /dev/null too


def started_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets TORCHELASTIC_RUN_ID for its workers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


# See report_usage_error. torchrun's SIGTERM after rank 0's exit took over 5 s on a machine
# running 5 processes per core: a rank waits that long before it reports a mistake of its own,
# and never more than half of --dist-timeout, which the other ranks wait for it before they
# report that the ranks cannot meet (the real mistake would come second).
USAGE_ERROR_GRACE_S = 20.0


def report_usage_error(
    message: str, env: dist.DistEnv, preemption: Preemption, dist_timeout: float | None
) -> None:
    """Print a mistake in the settings once, not once per rank: rank 0 reports it, and torchrun
    stops the others with SIGTERM once rank 0 exits. A rank that gets none within a few seconds
    found a mistake of its own (a GPU missing on its node, say) and reports it itself; so does a
    rank that no torchrun started (nothing would stop it). `dist_timeout`: None until parsed."""
    if env.rank != 0:
        if started_by_torchrun():
            grace_s = min(USAGE_ERROR_GRACE_S, (dist_timeout or float("inf")) / 2)
            deadline = time.monotonic() + grace_s
            while not preemption.requested and time.monotonic() < deadline:
                time.sleep(0.05)
            if preemption.requested:
                return
        message = f"rank {env.rank}: {message}"
    print(f"error: {message}", file=sys.stderr, flush=True)


# stop_at_once and fail exit without the teardown: other ranks may be anywhere (in a
# collective, say), and tearing down while gloo threads hold a collective, or while a
# checkpoint thread is inside torch.save, can abort (SIGABRT) or hang, hiding the real exit.
# The OS closes this rank's connections; torchrun stops the others (or restarts them all).


def stop_at_once() -> NoReturn:
    """After a second Ctrl-C: say so once, and exit 130 without saving or waiting for anyone."""
    if dist.is_main():
        print(
            "interrupted again (Ctrl-C): stopped at once, without saving; rerun to resume"
            " from the newest checkpoint",
            file=sys.stderr,
            flush=True,
        )
    sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)


# What a collective raises when another rank is gone or stalled: NCCL and the store raise
# torch.distributed.DistError (and subclasses); gloo raises a plain RuntimeError, whose message
# names gloo only through its source path, if at all: "Connection closed by peer [host]:port",
# "Connection reset by peer", "Timed out waiting 4000ms for recv operation to complete", and
# "Application timeout caused pair closure" for a collective queued behind one that timed out,
# "Connection refused" for a peer that is gone before a collective connects.
PEER_TROUBLE = ("gloo", "nccl", "by peer", "pair closure", "timed out waiting", "refused")


def collective_failed(err: BaseException) -> bool:
    """Whether `err` is a collective that failed because of another rank."""
    text = str(err).lower()
    return isinstance(err, torch_dist.DistError) or (
        isinstance(err, RuntimeError) and any(words in text for words in PEER_TROUBLE)
    )


def fail(err: BaseException, env: dist.DistEnv, timeout_s: int) -> NoReturn:
    """An exception escaped training: re-raise it with one process; with several, print it and
    exit 1 at once. A sample that cannot be read (DataError): one line naming it."""
    err = worker_lost(err)  # a loader worker killed: one line too
    if isinstance(err, DataError):
        print(f"error: rank {env.rank}: {err}", file=sys.stderr)
        if env.world_size == 1:
            dist.cleanup(clean_exit=False)
            raise SystemExit(1)
    elif env.world_size == 1:
        dist.cleanup(clean_exit=False)
        raise err
    else:
        sys.excepthook(type(err), err, err.__traceback__)  # torch's hook adds a [rankN] prefix
    if collective_failed(err):
        print(
            f"error: rank {env.rank}: a collective failed: another rank crashed, was killed, or"
            f" stalled for longer than --dist-timeout ({timeout_s} s). Look for its own error in"
            " this output; if there is none, it was killed or stalled (py-spy dump shows where)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
