"""Where a run starts: a checkpoint to continue (--resume), weights to fine-tune (--init-from),
or nothing. Decided on every rank before the process group exists, so that every mistake is
one line (ConfigError) instead of a traceback or a hang; docs/checkpoints.md has the rules.

A resume may change the run-only settings (run_only=True in config.py), --max-steps (the LR
schedule is recomputed) and the split of the global batch into --batch-size,
--grad-accum-steps and the world size; anything else would change the model or the
optimisation and is refused. A run owns its OUT_DIR (runlock.py): --resume never into one that
holds a run, and --resume PATH that would mix checkpoints of two runs there, are refused.
"""

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from . import dist, optim
from .checkpoint import NotACheckpoint, list_checkpoints, load, step_of, weights
from .config import ConfigError, RunConfig, flag, global_batch, run_only_settings
from .hooks import Task
from .options import values_before
from .paths import METRICS, checkpoint_dir
from .state import Start, TrainState
from .verify import (
    ModelShapes,
    check_model_fits,
    check_same_kind,
    check_structure,
    first_line,
    model_differences,
)

# On resume, besides the run-only settings (option(..., run_only=True) in config.py), the batch
# layout may change if the global batch stays the same, and --max-steps (optim.reschedule).
BATCH_LAYOUT = {"batch_size", "grad_accum_steps", "global_batch_size"}
REQUIRED = {*TrainState.KEYS, "config"}  # checkpoint.py adds the config


def may_change(cfg: RunConfig) -> set[str]:
    """The settings a resume may change: run-only ones, the batch layout, --max-steps and
    --epochs."""
    return run_only_settings(type(cfg)) | BATCH_LAYOUT | {"max_steps", "epochs"}


def find_start(cfg: RunConfig, task: Task, world_size: int, device: torch.device) -> Start:
    """The checkpoint to resume, or the weights to start from, per --resume and --init-from.
    The model shapes they are checked against are those of task.build_model."""
    shapes = ModelShapes(task.build_model)
    state = find_resume(cfg, task, shapes, world_size, device)
    if state is not None:
        if cfg.init_from:
            dist.print0(f"--init-from {cfg.init_from} is not used: this run continues instead")
        return Start(resume=state)
    if cfg.init_from:
        return Start(weights=find_weights(cfg, task, shapes, device))
    return Start()


def find_resume(
    cfg: RunConfig, task: Task, shapes: ModelShapes, world_size: int, device: torch.device
) -> dict[str, Any] | None:
    """The checkpoint to resume from per --resume, checked against the config; None = fresh."""
    if cfg.resume == "never":
        check_out_dir_is_new(cfg.out_dir)
        return None
    explicit = cfg.resume != "auto"
    path = Path(cfg.resume if explicit else cfg.out_dir)
    required = REQUIRED | {key for key, on in TrainState.OPTIONAL.items() if getattr(cfg, on)}
    found, problem = first_readable(path, required, device)
    if found is None:
        if explicit:
            raise ConfigError(f"--resume {cfg.resume}: no readable checkpoint ({problem})")
        if problem != "none found":
            dist.print0(f"warning: no readable checkpoint in {path} ({problem}); starting afresh")
        return None
    candidate, state = found
    what = f"--resume {candidate}"
    check_same_kind(state["model"], shapes(cfg, what), what)
    checked = task.check_checkpoint(state, candidate, resuming=True)  # its data, wherever it is
    check_compatible(state, cfg, world_size, candidate, may_change(cfg) | checked)
    check_model_fits(state["model"], shapes(cfg, what), what)
    if explicit:
        check_no_mixing(cfg, candidate, state["step"])
    dist.print0(f"resuming from {candidate} (step {state['step']})")
    note = optim.schedule_note(cfg, state["config"]["max_steps"], state["step"], world_size)
    if note:
        dist.print0(note)
    return state


def find_weights(
    cfg: RunConfig, task: Task, shapes: ModelShapes, device: torch.device
) -> dict[str, torch.Tensor]:
    """--init-from: the model weights of a checkpoint (or of what the task resolves, such as
    hf:NAME), checked against this run's model."""
    resolved = task.init_weights(cfg.init_from, device)
    if resolved is not None:
        dist.print0(f"starting from the weights of {cfg.init_from}: a new run at step 0")
        return resolved
    found, problem = first_readable(Path(cfg.init_from), {"model", "config"}, device)
    if found is None:
        raise ConfigError(f"--init-from {cfg.init_from}: no readable checkpoint ({problem})")
    candidate, state = found
    what = f"--init-from {candidate}"
    check_same_kind(state["model"], shapes(cfg, what), what)
    differences = model_differences(state["config"], cfg, may_change(cfg), shapes, what)
    if differences:
        raise ConfigError(
            f"{what}: its model was built with other settings: {'; '.join(differences)}."
            " Settings that shape the model must match (--lr and the like may differ)"
        )
    check_model_fits(state["model"], shapes(cfg, what), what)
    task.check_checkpoint(state, candidate, resuming=False)
    dist.print0(
        f"starting from the weights of {candidate} (its step {state.get('step', '?')}):"
        " a new run at step 0, with a fresh optimizer, LR schedule and data order"
    )
    return weights(state)  # whole, whatever the strategy that wrote it


def first_readable(
    path: Path, required: set[str], device: torch.device
) -> tuple[tuple[Path, dict[str, Any]] | None, str]:
    """The newest usable checkpoint at PATH (a file, or a run directory) and its state; or None,
    and what was wrong with the last one tried ("none found" when there were none)."""
    if path.is_file():
        candidates = [path]
    else:
        directory = checkpoint_dir(path) if checkpoint_dir(path).is_dir() else path
        candidates = list_checkpoints(directory)
    problem = "none found"
    for number, candidate in enumerate(candidates, start=1):
        try:
            state = load(candidate, device)
            check_structure(state, required)
        except Exception as err:  # truncated, empty, corrupt or not a checkpoint: try older
            problem = f"{candidate}: {err if isinstance(err, NotACheckpoint) else first_line(err)}"
            if number < len(candidates):
                dist.print0(f"warning: cannot read checkpoint {problem}; trying older ones")
            continue
        return (candidate, state), problem
    return None, problem


def check_compatible(
    state: dict[str, Any], cfg: RunConfig, world_size: int, path: Path, may_change: set[str]
) -> None:
    """Refuse to resume with settings that change the model or the optimisation."""
    # A setting the checkpoint lacks is newer than it: it was trained with its value before.
    saved, now = values_before(type(cfg)) | state["config"], asdict(cfg)
    differences = [
        f"{flag(name)} {saved.get(name)!r} in the checkpoint, {now[name]!r} now"
        for name in now
        if name not in may_change and saved.get(name) != now[name]
    ]
    layout = {name: saved[name] for name in ("batch_size", "grad_accum_steps")}
    saved_batch = global_batch(replace(cfg, **layout), state["world_size"])
    batch = global_batch(cfg, world_size)
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


def check_out_dir_is_new(out_dir: str) -> None:
    """--resume never starts a new run, which needs a directory of its own."""
    newest = list_checkpoints(checkpoint_dir(out_dir))[:1]
    if newest or (Path(out_dir) / METRICS).exists():
        what = f"newest checkpoint {newest[0]}" if newest else "metrics.jsonl, no checkpoint"
        raise ConfigError(
            f"--resume never: --out-dir {out_dir} already holds a run ({what}); use another"
            " --out-dir, delete it, or --resume auto to continue it"
        )


def check_no_mixing(cfg: RunConfig, source: Path, step: int) -> None:
    """--resume PATH must not mix the new run's checkpoints with others in --out-dir: a later
    --resume auto picks the newest checkpoint there, whichever run wrote it."""
    existing = list_checkpoints(checkpoint_dir(cfg.out_dir))
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
