"""Where a whole run of the generated trainer spends its time outside its training steps.

    BENCH_LAUNCHED=$(date +%s.%N) python -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m bench.image_phases --package benchproj -- --epochs 1 --data-path DATA ...

Runs `<package>.train.main` unmodified, as a user's run does (evaluation and checkpoints as the
flags say), with a clock around each phase: torchrun and the interpreter (from BENCH_LAUNCHED,
set by the launcher just before it starts torchrun), importing torch, torchvision and the
project, the task's data preparation and datasets, finding the start (resume), the process group,
the run lock and settings file, building the run (model, DDP, the dropout check, the loaders),
the first step (which waits for the loader workers' first batch), the other steps, the
evaluations, the checkpoint writes the steps waited for, and the teardown. Rank 0 prints one
result line with the seconds of each phase; the launcher adds the exit (main's return to
torchrun's exit), split at the interpreter's exit handlers.
"""

from __future__ import annotations

import time

STARTED = time.time()  # the interpreter is up: nothing imported yet but time

import atexit  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

IMPORTED: dict[str, float] = {}
for module in ("torch", "torchvision"):
    importlib.import_module(module)
    IMPORTED[module] = time.time()

from .timing import emit  # noqa: E402

SAVES = ("checkpoint saves (the step's part)", "checkpoint waits (the write's rest)")


class Phases:
    """Seconds per phase (summed over calls) and the end of the first call of each."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.first_end: dict[str, float] = {}
        self.last_end: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                ended = time.time()
                self.seconds[phase] = self.seconds.get(phase, 0.0) + ended - started
                self.calls[phase] = self.calls.get(phase, 0) + 1
                self.first_end.setdefault(phase, ended)
                self.last_end[phase] = ended

        setattr(owner, name, timed)


def main() -> int:
    argv = sys.argv[1:]
    package = "benchproj"
    if argv[:1] == ["--package"]:
        package, argv = argv[1], argv[2:]
    argv = argv[1:] if argv[:1] == ["--"] else argv
    train = importlib.import_module(f"{package}.train")
    imported = time.time()
    phases = Phases()
    phases.wrap(train.Task, "prepare", "prepare the data")
    phases.wrap(train.Task, "build_datasets", "build the datasets")
    phases.wrap(train.resume, "find_start", "find the start (resume)")
    phases.wrap(train.dist, "setup", "process group")
    phases.wrap(train.RunLock, "acquire", "run lock")
    phases.wrap(train, "write_settings", "settings file")
    phases.wrap(train, "build_run", "build the run (model, DDP, checks, loaders)")
    phases.wrap(train, "train_step", "steps")
    phases.wrap(train, "evaluate", "evaluations")
    phases.wrap(train.checkpoint.Checkpointer, "save", SAVES[0])
    phases.wrap(train.checkpoint.Checkpointer, "wait", SAVES[1])
    phases.wrap(train.dist, "cleanup", "teardown (process group)")
    status = train.main(argv)
    returned = time.time()
    launched = float(os.environ.get("BENCH_LAUNCHED", STARTED))
    record: dict[str, Any] = {
        "exit_status": status,
        "torchrun and the interpreter": STARTED - launched,
        "import torch": IMPORTED["torch"] - STARTED,
        "import torchvision": IMPORTED["torchvision"] - IMPORTED["torch"],
        "import the project": imported - IMPORTED["torchvision"],
        **phases.seconds,
        "calls": phases.calls,
        "imports done": imported - launched,
        "first step done": phases.first_end.get("steps", returned) - launched,
        "last step done": phases.last_end.get("steps", returned) - launched,
        "last save done": max(
            [phases.last_end.get(p, 0.0) for p in SAVES] + [phases.last_end.get("steps", returned)]
        )
        - launched,
        "main returned": returned - launched,
    }
    emit(record)
    # Registered last, so run first of the exit handlers: what follows is the interpreter's
    # teardown (torch's and the loaders' own handlers) and torchrun noticing the exit.
    atexit.register(lambda: emit({**record, "exit handlers reached": time.time() - launched}))
    return status


if __name__ == "__main__":
    sys.exit(main())
