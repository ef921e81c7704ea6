"""Checkpoints: OUT_DIR/checkpoints/step_<8-digit step>.pt, written by rank 0 only.

`step_N.pt` holds the state after N optimizer steps (TrainState.state_dict): the model (a
plain state_dict, without DDP's `module.` prefix), optimizer, LR scheduler, GradScaler, the
data position (epoch and samples consumed in it), the RNG states of every rank; and the
config, world size and versions.
Only plain types and tensors go in, so it loads with `torch.load(..., weights_only=True)`.
Under --strategy fsdp the model and optimizer go into a directory of shards next to it,
step_N.dcp/, which the .pt file completes (sharded.py).
Which checkpoint a run starts from (--resume, --init-from) is decided in resume.py.

Saving does not stall training (Checkpointer): the state is copied into host buffers that
every save reuses (pinned memory for a GPU, in stream order, so the next step cannot change it
under the copy) and a background thread writes it while training goes on. One save is in
flight at most: the next one first waits for it. Writes are atomic (a temporary file, fsync,
rename): a crash mid-write leaves the previous checkpoint as the newest readable one.

Rotation keeps the checkpoint just written and the newest --keep-last - 1 before it, and
leaves later steps alone. A save that fails (a full disk, say) leaves no partial file behind;
the ranks learn it at the next step that logs (or at the end of the run), and all of them
stop there with one line saying which checkpoint is left. A run whose
run.lock another run has taken over (lock.py) writes and deletes nothing more.
"""

import os
import platform
import random
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from . import dist, optim, sharded, strategy
from .config import TrainConfig
from .lock import RunLock


@dataclass
class Start:
    """Where a run starts (resume.find_start): a checkpoint, weights, or from scratch."""

    resume: dict[str, Any] | None = None  # a checkpoint to continue exactly (--resume)
    weights: dict[str, torch.Tensor] | None = None  # a new run from these weights (--init-from)


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch being read (the sampler's shuffle seed is seed + epoch)
    position: int = 0  # samples of this epoch already consumed, summed over ranks

    def advance(self, samples: int, end_of_epoch: bool) -> None:
        """Count one optimizer step that consumed `samples` (summed over ranks)."""
        self.step += 1
        self.position += samples
        if end_of_epoch:
            self.epoch, self.position = self.epoch + 1, 0


@dataclass
class TrainState:
    """Everything training changes, and so everything an exact resume restores, as one object.

    `model` as it trains: wrapped in DDP, sharded by FSDP, or plain. A new piece of state (an
    EMA of the weights, a second optimizer) is a field here, and one line in state_dict() and
    one in load_state_dict(): the checkpoint and the resume follow.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    progress: Progress = field(default_factory=Progress)

    def state_dict(self) -> dict[str, Any]:
        """The state as plain types and tensors. A collective: every rank must call it.

        Every rank's RNG state (and PowerSGD's, per rank) goes in, one entry per rank. Under
        FSDP the model and optimizer are left out: Checkpointer.save writes them as shards.
        """
        rng = dist.all_gather_object(_rng_state(_device_of(self.model)))
        is_sharded = strategy.is_sharded(self.model)
        return {
            # The unwrapped module: no `module.` prefix.
            "model": {} if is_sharded else strategy.unwrap(self.model).state_dict(),
            "optimizer": {} if is_sharded else self.optimizer.state_dict(),
            "sharded": is_sharded,
            # PowerSGD's error feedback and Q, per rank (--comm-hook; None for the others).
            "comm_hook": dist.all_gather_object(strategy.comm_hook_state(self.model)),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            **asdict(self.progress),
            "rng": rng,
            "world_size": len(rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint that load() read and resume.py checked.

        Per-rank states (RNG, PowerSGD) only come back at the world size they were saved at:
        at another, the run goes on but is no longer bitwise reproducible (a warning says so).
        """
        if state.get("sharded"):  # the shards of any world size; resume.py refused others
            sharded.load(self.model, self.optimizer, state["shards"])
        else:
            strategy.unwrap(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(state["step"], state["epoch"], state["position"])
        rank, world_size = dist.rank(), dist.world_size()
        if state["world_size"] == world_size:
            _set_rng_state(state["rng"][rank], _device_of(self.model))
            hook_states = state.get("comm_hook", [None] * world_size)  # older checkpoints: none
            strategy.set_comm_hook_state(self.model, hook_states[rank])
        else:
            powersgd = any(state.get("comm_hook") or [])  # its error feedback is per rank too
            dist.print0(
                f"warning: the checkpoint has {state['world_size']} ranks, this run {world_size};"
                " RNG states are not restored"
                + (" (nor PowerSGD's error feedback)" if powersgd else "")
                + ", so the run is not bitwise reproducible"
            )

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """--init-from: the model's weights only; optimizer, schedule and progress stay fresh."""
        if strategy.is_sharded(self.model):
            sharded.load_weights(self.model, weights)
        else:
            strategy.unwrap(self.model).load_state_dict(weights)


def checkpoint_path(out_dir: str, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step_{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """The step_*.pt files in a directory, newest first."""
    paths = [p for p in directory.glob("step_*.pt") if p.stem.removeprefix("step_").isdigit()]
    return sorted(paths, key=step_of, reverse=True)


def stray_temp_files(directory: Path) -> list[Path]:
    """Temporary files of saves that never finished; never read, removed by the next save.

    Also shard directories (FSDP) whose .pt file was never written, or was deleted.
    """
    orphans = [d for d in directory.glob("step_*.dcp") if not d.with_suffix(".pt").exists()]
    return sorted([*directory.glob("step_*.pt.tmp"), *directory.glob("step_*.dcp.tmp"), *orphans])


def step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


class Checkpointer:
    """Writes checkpoints in the background on rank 0; every rank calls save().

    save() returns after the state has been copied off the device: the seconds it took are the
    training stall of that save, reported in metrics.jsonl (ckpt_stall_s). The write itself
    (pickling, the disk, fsync) runs on a thread, overlapped with the next steps. A write that
    failed leaves `problem` set on rank 0, which the training loop tells every rank.
    """

    def __init__(self, cfg: TrainConfig, is_main: bool, run_lock: RunLock | None = None) -> None:
        self.cfg, self.is_main, self.run_lock = cfg, is_main, run_lock
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

        Under FSDP every rank first writes its shards, together (torch.distributed.checkpoint);
        the .pt file that completes the checkpoint is then written in the background like any
        other.
        """
        started = time.perf_counter()
        self._last_save = time.monotonic()
        self.wait()  # one save in flight at most
        payload = state.state_dict()
        payload["config"] = asdict(self.cfg)
        payload["versions"] = {"torch": str(torch.__version__), "python": platform.python_version()}
        step = state.progress.step
        path = checkpoint_path(self.cfg.out_dir, step)
        if payload["sharded"]:
            problem = None
            try:
                sharded.save(state.model, state.optimizer, path)
            except (Exception, CheckpointException) as err:  # not an Exception: DCP's own
                problem = save_problem(err, step, sharded.shard_dir(path))
            self.problem = next(filter(None, dist.all_gather_object(problem)), self.problem)
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
        """A copy of `value` whose tensors live in host memory, in buffers kept from the last
        save (the write of which has finished): allocating and filling a new copy each time
        cost a third of a synchronous save, on the training thread. For a GPU: queued copies
        into pinned memory."""
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
            _remove(sharded.shard_dir(path))  # FSDP: shards that no .pt will complete
            return
        if self._lost(f"step {state['step']} was saved, no older one deleted"):
            return
        # Delete old checkpoints only now that the new one is safely on disk, and never the
        # new one: keep it and the newest keep_last - 1 before it. Later steps are left alone
        # (an unreadable newest checkpoint that --resume auto skipped, say): they are not
        # older. Also delete temporary files of saves that a crash interrupted (this run holds
        # OUT_DIR/run.lock: no other process writes here).
        older = [p for p in list_checkpoints(path.parent) if step_of(p) < state["step"]]
        for old in older[self.cfg.keep_last - 1 :] + stray_temp_files(path.parent):
            _remove(old)
            _remove(sharded.shard_dir(old))  # FSDP: after its .pt, which completes it

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
    """What went wrong, without a traceback: 'No space left on device' for a full disk.

    torch.save reports a full disk as RuntimeError ("PytorchStreamWriter failed writing
    file"), whose cause or context is the OSError of the write itself: name that. DCP's
    CheckpointException holds every rank's own failure.
    """
    failures = getattr(err, "failures", None)
    errors = [failure[0] for failure in failures.values()] if isinstance(failures, dict) else []
    for seen in (err, *errors):
        while seen is not None:
            if isinstance(seen, OSError) and seen.strerror:
                return seen.strerror
            seen = seen.__cause__ or seen.__context__
    return _first_line(errors[0] if errors else err)


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

    A sharded one (FSDP) gets `model` as shapes only (on the meta device), for the checks of
    resume.py, and `shards`, the directory that TrainState.load_state_dict reads them from.
    """
    state = torch.load(path, map_location=device, weights_only=True)
    if isinstance(state, dict) and state.get("sharded"):
        state["shards"] = sharded.shard_dir(path)
        state["model"] = sharded.shapes(state["shards"])  # fails if the directory is damaged
    return state


def weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A loaded checkpoint's whole model weights as a plain state_dict, whatever the strategy."""
    return sharded.full_weights(state["shards"]) if state.get("sharded") else state["model"]


def restore(start: Start, state: TrainState, cfg: TrainConfig) -> None:
    """Load where the run starts (resume.find_start) into a freshly built state."""
    if start.weights is not None:  # --init-from: the weights only; step 0, all else fresh
        state.load_weights(start.weights)
    if start.resume is not None:
        state.load_state_dict(start.resume)
        optim.reschedule(state.optimizer, state.scheduler, cfg)  # --max-steps may have changed


def _device_of(model: nn.Module) -> torch.device:
    """Where the model trains (its parameters' device; a DTensor's is its shard's)."""
    return next(model.parameters()).device


def _rng_state(device: torch.device) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def _set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"].cpu())  # map_location moved it; RNG states live on CPU
    if rng["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), device)


def _remove(path: Path) -> None:
    """Delete a file or a directory (of shards) if it exists. Cleaning up is best effort: a
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
