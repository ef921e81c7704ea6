"""Stopping a run cleanly: SIGTERM, Ctrl-C (SIGINT), and torchrun's death under its workers.

SIGTERM is how SLURM, Kubernetes and torchrun ask a job to stop; Ctrl-C is how a person does.
Both only set a flag here: saving inside a signal handler could interrupt a collective, and
ranks would save at different steps. The loop agrees on the flag over all ranks
(dist.AgreeLater) and stops at a step boundary, where rank 0 saves the step. Ctrl-C exits
130 (128 + SIGINT), everything else 143 (128 + SIGTERM).

A second Ctrl-C means "now": it raises Interrupted wherever the process is, and the run exits
130 at once, without saving. So does a SIGTERM after a Ctrl-C: torchrun, asked twice, passes
the second request on to its workers as SIGTERM.
"""

import os
import signal
import sys
import threading
from typing import Any, NoReturn, Self

from . import dist

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


class Interrupted(BaseException):
    """A second Ctrl-C: stop at once. A BaseException, like KeyboardInterrupt: nothing catches it
    by accident on the way out."""


class Preemption:
    """While active, SIGTERM and SIGINT only set `reason`; so does the death of torchrun.

    A launcher killed with SIGKILL (or lost with its node) cannot pass a signal on, and its
    workers would go on training and writing checkpoints, orphaned, alongside a rerun. So
    under torchrun a background thread watches the parent process: when the worker is
    re-parented, torchrun is gone, and the run stops as after SIGTERM.
    """

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
            watch = threading.Thread(target=self._watch, args=(parent,), daemon=True)
            watch.start()
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


def stop_at_once() -> NoReturn:
    """After a second Ctrl-C: say so once, and exit 130 without saving or waiting for anyone.

    The process exits at once, skipping the teardown, as dist.fail does: other ranks may be
    anywhere (in a collective, say), and a checkpoint may be half written by its thread, inside
    torch.save, which an interpreter shutting down around it would abort (SIGABRT).
    """
    if dist.is_main():
        print(
            "interrupted again (Ctrl-C): stopped at once, without saving; rerun to resume"
            " from the newest checkpoint",
            file=sys.stderr,
            flush=True,
        )
    sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)
