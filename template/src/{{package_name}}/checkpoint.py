"""Checkpoints: OUT_DIR/checkpoints/step_<8-digit step>.pt, written by rank 0 only.

step_N.pt holds the state after N optimizer steps (state.TrainState: model without DDP's
`module.` prefix, optimizer, schedule, scaler, data position, every rank's RNG), the config
and versions: plain types and tensors, loaded with `torch.load(..., weights_only=True)`.

Saving barely stalls training: the state is copied into reused host buffers (pinned memory,
in stream order, for a GPU) and a thread writes it while training goes on, one save in flight
at most. Writes are atomic (temporary file, fsync, rename); old checkpoints are deleted only
after the new one is on disk (--keep-last). A failed write (a full disk) sets `problem`, and
the training loop stops every rank at the next step that logs.
"""

import os
import platform
import shutil
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from . import strategy
from .config import TrainConfig
from .lock import RunLock
from .state import TrainState


def checkpoint_path(out_dir: str, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step_{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """The step_*.pt files in a directory, newest first."""
    paths = [p for p in directory.glob("step_*.pt") if p.stem.removeprefix("step_").isdigit()]
    return sorted(paths, key=step_of, reverse=True)


def stray_temp_files(directory: Path) -> list[Path]:
    """Temporary files of saves that never finished; never read, removed by the next save.

    Also what a strategy wrote beside a step_N.pt that was never written, or was deleted.
    """
    orphans = [p for p in directory.glob("step_*.*") if not p.with_suffix(".pt").exists()]
    return sorted({*directory.glob("step_*.tmp"), *orphans})


def beside(path: Path) -> list[Path]:
    """What a strategy wrote beside checkpoint file `path` (step_N.*, but step_N.pt itself)."""
    return [p for p in path.parent.glob(f"{path.stem}.*") if p.name != path.name]


def step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


class Checkpointer:
    """Writes checkpoints in the background on rank 0; every rank calls save().

    save() returns once the state is copied off the device: that is the training stall
    (ckpt_stall_s in metrics.jsonl). A write that failed leaves `problem` set on rank 0.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        is_main: bool,
        run_lock: RunLock | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.cfg, self.is_main, self.run_lock = cfg, is_main, run_lock
        self.extra = extra or {}  # what the task keeps in every checkpoint (plain types)
        self._thread: threading.Thread | None = None
        self._writing: Path | None = None  # the checkpoint being written
        self.problem: str | None = None  # why the last write failed (rank 0), once it has
        self._buffers: dict[str, torch.Tensor] = {}  # host copies of the state, for every save
        self._last_save = time.monotonic()

    def due_by_time(self) -> int:
        """1 if --ckpt-every-minutes (> 0) have passed since the last save, on this rank's clock."""
        minutes = self.cfg.ckpt_every_minutes
        return int(minutes > 0 and time.monotonic() - self._last_save >= minutes * 60)

    def save(self, state: TrainState) -> float:
        """Start saving `state` (a collective); returns the seconds training stalled for it.

        What the strategy writes beside the file (save_beside) is written first, by every
        rank; the file that completes the checkpoint is then written in the background.
        """
        started = time.perf_counter()
        self._last_save = time.monotonic()
        self.wait()  # one save in flight at most
        payload = state.state_dict()
        payload["config"] = asdict(self.cfg)
        payload["versions"] = {"torch": str(torch.__version__), "python": platform.python_version()}
        payload |= self.extra
        step = state.progress.step
        path = checkpoint_path(self.cfg.out_dir, step)
        try:
            state.strategy.save_beside(state.model, state.optimizer, path)  # on every rank
        except Exception as err:  # raised on every rank, whichever failed
            self.problem = save_problem(err, step, path)
        if self.is_main and not self.problem:  # every rank built the payload: a collective
            staged, copied = self._stage(payload), None
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                copied = torch.cuda.Event()  # marks the end of the copies queued above
                copied.record()
            self._writing = path
            self._thread = threading.Thread(
                target=self._write, args=(staged, copied, path), name="checkpoint", daemon=True
            )
            self._thread.start()
        return time.perf_counter() - started

    def wait(self) -> None:
        """Wait until the save in flight is on disk, or has failed (`problem`)."""
        if self._thread is not None:
            self._thread.join()
            self._thread, self._writing = None, None

    def abandon(self) -> None:
        """Stop at once (a second Ctrl-C): remove the file being written, wait for nothing.
        The thread is a daemon: it dies with the process."""
        if self._writing is not None:
            self._writing.with_name(self._writing.name + ".tmp").unlink(missing_ok=True)

    def _stage(self, value: Any, key: str = "") -> Any:
        """A copy of `value` with its tensors in host buffers kept from the last save (whose
        write has finished): fresh ones each time cost a third of a synchronous save."""
        if isinstance(value, torch.Tensor):
            on_gpu = value.device.type != "cpu"
            buffer = self._buffers.get(key)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = torch.empty_like(value, device="cpu", pin_memory=on_gpu)
                self._buffers[key] = buffer
            # On a GPU, queued on the current stream, so it reads the values before the next
            # optimizer step's kernels change them; non_blocking: the host does not wait here.
            return buffer.copy_(value.detach(), non_blocking=on_gpu)
        if isinstance(value, dict):
            return {k: self._stage(v, f"{key}/{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._stage(v, f"{key}/{i}") for i, v in enumerate(value))
        return value  # plain Python values: already a snapshot (asdict, getstate)

    def _write(self, state: dict[str, Any], copied: torch.cuda.Event | None, path: Path) -> None:
        if copied is not None:
            copied.synchronize()  # this thread waits for the copies; training does not
        if self._lost(f"step {state['step']} was not saved"):
            return
        try:
            _write_atomic(state, path)
        except Exception as err:  # a full disk (torch.save raises RuntimeError), a quota, ...
            self.problem = save_problem(err, state["step"], path)
            for extra in beside(path):  # that no checkpoint file will complete
                _remove(extra)
            return
        if self._lost(f"step {state['step']} was saved, no older one deleted"):
            return
        # Keep the new one and the newest keep_last - 1 before it; later steps are not older
        # (an unreadable one --resume auto skipped). This run holds OUT_DIR/run.lock: no
        # other process writes here, so temporary files are leftovers of crashed saves.
        older = [p for p in list_checkpoints(path.parent) if step_of(p) < state["step"]]
        for old in older[self.cfg.keep_last - 1 :]:
            _remove(old)
            for extra in beside(old):  # after the file, which completes the checkpoint
                _remove(extra)
        for stray in stray_temp_files(path.parent):
            _remove(stray)

    def _lost(self, what: str) -> bool:
        """Has another run taken over OUT_DIR (lock.py)? Then note why, with `what` happened."""
        lost = self.run_lock.lost() if self.run_lock else None
        if lost:
            self.problem = f"{lost}; {what}"
        return bool(lost)


def save_problem(err: BaseException, step: int, path: Path) -> str:
    """'no space left on device while saving step 8 to PATH': one line."""
    why = os_error_text(err)
    return f"{why[:1].lower()}{why[1:]} while saving step {step} to {path}"


def os_error_text(err: BaseException) -> str:
    """'No space left on device' for a full disk: torch.save raises RuntimeError, whose cause
    or context is the OSError of the write itself."""
    found = os_error(err)
    return found.strerror if found else _first_line(err)


def os_error(err: BaseException) -> OSError | None:
    """The OSError behind `err` (itself, or its cause or context, at any depth), if any."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def newest_note(out_dir: str) -> str:
    """'the newest checkpoint is step 10 (PATH)': what a rerun resumes from."""
    newest = list_checkpoints(Path(out_dir) / "checkpoints")[:1]
    if not newest:
        return "no checkpoint was saved"
    return f"the newest checkpoint is step {step_of(newest[0])} ({newest[0]})"


def _write_atomic(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file, then rename: a crash never leaves a half-written step_N.pt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)  # atomic: readers see the old name or the complete new file
    except BaseException:  # a full disk, say: leave no partial file behind
        _remove(tmp)
        raise
    if os.name == "posix":  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        os.fsync(directory)
        os.close(directory)


def load(path: Path, device: torch.device) -> dict[str, Any]:
    """Load a checkpoint onto this rank's device; weights_only refuses arbitrary objects.
    What a strategy wrote beside it is checked and made readable (strategy.complete)."""
    state = torch.load(path, map_location=device, weights_only=True)
    return strategy.complete(state, path) if isinstance(state, dict) else state


def weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A loaded checkpoint's whole model weights as a plain state_dict, whatever the strategy."""
    return strategy.full_weights(state)


def _remove(path: Path) -> None:
    """Delete a file or a directory if it exists. Cleaning up is best effort: a
    file that cannot be deleted (a read-only directory) stays, and the run goes on."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
