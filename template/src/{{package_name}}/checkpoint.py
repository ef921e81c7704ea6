"""Checkpoints: OUT_DIR/checkpoints/step_<8-digit step>.pt, written by rank 0 only.

`step_N.pt` holds the state after N optimizer steps: the model (a plain state_dict, without
DDP's `module.` prefix), optimizer, LR scheduler, GradScaler, the data position (epoch and
samples consumed in it), the RNG states of every rank, the config, world size and versions.
Only plain types and tensors go in, so it loads with `torch.load(..., weights_only=True)`.

Resuming (--resume):
- auto: the newest readable checkpoint in OUT_DIR (a corrupt one falls back to the one before,
  with a warning), or a fresh start when there is none.
- never: a fresh start, in an OUT_DIR that holds no run yet (no checkpoints, no metrics.jsonl).
- PATH: a checkpoint file, or a run directory (its newest readable checkpoint); it may belong
  to another run. Run-only settings (RUN_ONLY) may differ from the checkpoint's config; any
  other difference would change the model or the optimisation and is refused.
- The batch layout (--batch-size, --grad-accum-steps, --global-batch-size) and the world size
  may change as long as the global batch stays the same, e.g. a job requeued on half the GPUs
  with twice the accumulation. Model, optimizer, schedule and data position carry over, but
  per-rank RNG states cannot be mapped to other ranks: they are not restored (with a warning)
  and the run is no longer bitwise reproducible. Same world size: the resume is exact.

A run owns its OUT_DIR (see lock.py): its checkpoints must not mix with another run's, since
--resume auto takes the newest, whoever wrote it, and rotation deletes the oldest. So
--resume never into an OUT_DIR that holds a run is refused, and so is --resume PATH when
OUT_DIR/checkpoints holds checkpoints of another run (PATH outside OUT_DIR) or of later steps.
Rotation keeps the checkpoint just written and the newest --keep-last - 1 before it, and
leaves later steps alone.
"""

import os
import platform
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import dist
from .config import ConfigError, TrainConfig, flag

# Settings that do not change what is computed, only where and how often it is written.
RUN_ONLY = {"out_dir", "resume", "ckpt_every", "keep_last", "log_every", "eval_every"}
RUN_ONLY |= {"num_workers", "device", "dist_timeout", "detect_anomaly"}
BATCH_LAYOUT = {"batch_size", "grad_accum_steps", "global_batch_size"}
REQUIRED = {"model", "optimizer", "scheduler", "scaler", "step", "epoch", "position", "rng"}
REQUIRED |= {"config", "world_size"}


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


def checkpoint_path(out_dir: str, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step_{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """The step_*.pt files in a directory, newest first."""
    paths = [p for p in directory.glob("step_*.pt") if p.stem.removeprefix("step_").isdigit()]
    return sorted(paths, key=step_of, reverse=True)


def stray_temp_files(directory: Path) -> list[Path]:
    """Temporary files of saves that never finished; never read, removed by the next save."""
    return sorted(directory.glob("step_*.pt.tmp"))


def build_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    progress: Progress,
    cfg: TrainConfig,
    device: torch.device,
) -> dict[str, Any]:
    """Everything an exact resume needs. A collective: every rank must call it."""
    rng = dist.all_gather_object(_rng_state(device))  # one entry per rank
    return {
        "model": model.state_dict(),  # the unwrapped module: no `module.` prefix
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        **asdict(progress),
        "rng": rng,
        "config": asdict(cfg),
        "world_size": len(rng),
        "versions": {"torch": str(torch.__version__), "python": platform.python_version()},
    }


def step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


def save(state: dict[str, Any], out_dir: str, keep_last: int, is_main: bool) -> None:
    """Rank 0 writes atomically and rotates; then all ranks wait until the file exists."""
    if is_main:
        path = checkpoint_path(out_dir, state["step"])
        _write_atomic(state, path)
        # Delete old checkpoints only now that the new one is safely on disk, and never the
        # new one: keep it and the newest keep_last - 1 before it. Later steps are left alone
        # (an unreadable newest checkpoint that --resume auto skipped, say): they are not
        # older. Also delete temporary files of saves that a crash interrupted (this run
        # holds OUT_DIR/run.lock: no other process writes here).
        older = [p for p in list_checkpoints(path.parent) if step_of(p) < state["step"]]
        for old in older[keep_last - 1 :] + stray_temp_files(path.parent):
            old.unlink()
    dist.barrier()


def _write_atomic(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file, then rename: a crash never leaves a half-written step_N.pt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)  # atomic: readers see the old name or the complete new file
    if os.name == "posix":  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        os.fsync(directory)
        os.close(directory)


def load(path: Path, device: torch.device) -> dict[str, Any]:
    """Load a checkpoint onto this rank's device; weights_only refuses arbitrary objects."""
    return torch.load(path, map_location=device, weights_only=True)


def find_resume(cfg: TrainConfig, world_size: int, device: torch.device) -> dict[str, Any] | None:
    """The checkpoint to resume from per --resume, checked against the config; None = fresh."""
    if cfg.resume == "never":
        check_out_dir_is_new(cfg.out_dir)
        return None
    explicit = cfg.resume != "auto"
    path = Path(cfg.resume if explicit else cfg.out_dir)
    if path.is_file():
        candidates = [path]
    else:
        directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        candidates = list_checkpoints(directory)
    problem = "none found"
    for candidate in candidates:
        try:
            state = load(candidate, device)
            if not REQUIRED <= state.keys():
                raise ValueError(f"missing {sorted(REQUIRED - state.keys())}")
        except Exception as err:  # truncated, empty, corrupt or not a checkpoint: try older
            problem = f"{candidate}: {_first_line(err)}"
            dist.print0(f"warning: cannot read checkpoint {problem}; trying older ones")
            continue
        check_compatible(state, cfg, world_size, candidate)
        if explicit:
            check_no_mixing(cfg, candidate, state["step"])
        dist.print0(f"resuming from {candidate} (step {state['step']})")
        return state
    if explicit:
        raise ConfigError(f"--resume {cfg.resume}: no readable checkpoint ({problem})")
    if candidates:
        dist.print0(f"warning: no readable checkpoint in {path}; starting from scratch")
    return None


def check_out_dir_is_new(out_dir: str) -> None:
    """--resume never starts a new run, which needs a directory of its own."""
    newest = list_checkpoints(Path(out_dir) / "checkpoints")[:1]
    if newest or (Path(out_dir) / "metrics.jsonl").exists():
        what = f"newest checkpoint {newest[0]}" if newest else "metrics.jsonl, no checkpoint"
        raise ConfigError(
            f"--resume never: --out-dir {out_dir} already holds a run ({what}); use another"
            " --out-dir, delete it, or --resume auto to continue it"
        )


def check_no_mixing(cfg: TrainConfig, source: Path, step: int) -> None:
    """--resume PATH must not mix the new run's checkpoints with others in --out-dir.

    A later --resume auto picks the newest checkpoint there, whichever run wrote it.
    """
    existing = list_checkpoints(Path(cfg.out_dir) / "checkpoints")
    if not existing:
        return
    if not source.resolve().is_relative_to(Path(cfg.out_dir).resolve()):
        raise ConfigError(
            f"--resume {cfg.resume}: --out-dir {cfg.out_dir} already holds checkpoints of"
            f" another run (newest {existing[0]}); use another --out-dir, delete them, or"
            " --resume auto to continue that run"
        )
    if step_of(existing[0]) > step:
        raise ConfigError(
            f"--resume {cfg.resume}: --out-dir {cfg.out_dir} holds checkpoints after step"
            f" {step} (newest {existing[0]}), which a later --resume auto would pick; delete"
            f" them to go back to step {step}, or use another --out-dir"
        )


def _first_line(err: Exception) -> str:
    """'EOFError' or 'KeyError: 101': the kind of error and its first line, if any."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def check_compatible(state: dict[str, Any], cfg: TrainConfig, world_size: int, path: Path) -> None:
    """Refuse to resume with settings that change the model or the optimisation."""
    saved, now = state["config"], asdict(cfg)
    differences = [
        f"{flag(name)} {saved.get(name)!r} in the checkpoint, {now[name]!r} now"
        for name in now
        if name not in RUN_ONLY | BATCH_LAYOUT and saved.get(name) != now[name]
    ]
    saved_batch = saved["batch_size"] * saved["grad_accum_steps"] * state["world_size"]
    batch = cfg.batch_size * cfg.grad_accum_steps * world_size
    if saved_batch != batch:
        differences.append(
            f"global batch (--batch-size x --grad-accum-steps x world size) {saved_batch} in the"
            f" checkpoint, {batch} now (--global-batch-size {saved_batch} keeps it)"
        )
    if differences:
        raise ConfigError(
            f"--resume: {path} was trained with other settings: {'; '.join(differences)}."
            " Use the same values, or start afresh in another --out-dir"
        )


def restore(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    env: dist.DistEnv,
    device: torch.device,
) -> Progress:
    """Load a checkpoint's state into freshly built objects; returns where training stands."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    if state["world_size"] == env.world_size:
        _set_rng_state(state["rng"][env.rank], device)
    else:
        dist.print0(
            f"warning: the checkpoint has {state['world_size']} ranks, this run {env.world_size};"
            " RNG states are not restored, so the run is not bitwise reproducible"
        )
    return Progress(state["step"], state["epoch"], state["position"])


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
