"""How a run stops: SIGTERM, Ctrl-C, torchrun's death, a usage error, or a failure.

SIGTERM (SLURM, Kubernetes, torchrun) and Ctrl-C only set a flag: the ranks agree on it
(dist.AgreeLater) and stop together at a step boundary, after rank 0 saved the step. A second
Ctrl-C (or a SIGTERM after one: torchrun passes a second Ctrl-C on as SIGTERM) stops at once.
"""

import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn, Self

import torch.distributed as torch_dist

from . import dist

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


class Interrupted(BaseException):
    """A second Ctrl-C: stop at once. A BaseException, like KeyboardInterrupt: nothing catches it
    by accident on the way out."""


class Preemption:
    """While active, SIGTERM and SIGINT only set `reason`; so does the death of torchrun (a
    launcher killed with SIGKILL cannot pass a signal on, and its orphaned workers would train
    on beside a rerun): under torchrun a thread sees the worker re-parented."""

    SIGTERM, LAUNCHER_EXITED, INTERRUPT = 1, 2, 3  # reasons; the ranks agree on the largest
    WHY = {
        SIGTERM: "SIGTERM",
        LAUNCHER_EXITED: "launcher (torchrun) exited",
        INTERRUPT: "interrupted (Ctrl-C)",
    }
    EXIT_STATUS = {SIGTERM: 143, LAUNCHER_EXITED: 143, INTERRUPT: EXIT_INTERRUPTED}
    WATCH_EVERY_S = 1.0
    reason = 0
    interrupted = False  # this process got a Ctrl-C: the next signal stops it at once

    @property
    def requested(self) -> bool:
        return self.reason > 0

    def __enter__(self) -> Self:
        handled = (signal.SIGTERM, signal.SIGINT)
        self._previous = {signum: signal.signal(signum, self._handle) for signum in handled}
        self._done = threading.Event()
        if "TORCHELASTIC_RUN_ID" in os.environ:  # set by torchrun for its workers
            parent = os.getppid()
            threading.Thread(target=self._watch, args=(parent,), daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.interrupted:
            raise Interrupted
        if signum == signal.SIGINT:
            self.interrupted = True
            self.reason = max(self.reason, self.INTERRUPT)
        else:
            self.reason = max(self.reason, self.SIGTERM)

    def _watch(self, parent: int) -> None:
        while not self._done.wait(self.WATCH_EVERY_S):
            if os.getppid() != parent:
                self.reason = max(self.reason, self.LAUNCHER_EXITED)
                return


USAGE_ERROR_GRACE_S = 5.0  # see report_usage_error


def report_usage_error(message: str, env: dist.DistEnv, preemption: Preemption) -> None:
    """Print a mistake in the settings once, not once per rank: rank 0 reports it, and torchrun
    stops the others with SIGTERM once rank 0 exits. A rank that gets none within a few seconds
    found a mistake of its own (a GPU missing on its node, say) and reports it itself."""
    if env.rank != 0:
        deadline = time.monotonic() + USAGE_ERROR_GRACE_S
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


def fail(err: BaseException, env: dist.DistEnv, timeout_s: int) -> NoReturn:
    """An exception escaped training: re-raise it with one process; with several, print it and
    exit 1 at once."""
    if env.world_size == 1:
        dist.cleanup(clean_exit=False)
        raise err
    sys.excepthook(type(err), err, err.__traceback__)  # torch's hook adds a [rankN] prefix
    if isinstance(err, torch_dist.DistError) or "gloo" in str(err) or "NCCL" in str(err):
        print(
            f"error: rank {env.rank}: a collective failed: another rank crashed, was killed, or"
            f" stalled for longer than --dist-timeout ({timeout_s} s). Look for its own error in"
            " this output; if there is none, it was killed or stalled (py-spy dump shows where)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
