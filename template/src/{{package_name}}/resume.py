"""Where a run starts: a checkpoint to continue (--resume), weights to fine-tune (--init-from),
or nothing. Decided on every rank before the process group exists, so that every mistake is
one line (ConfigError) instead of a traceback or a hang.

--resume:
- auto: the newest readable checkpoint in OUT_DIR (a corrupt one falls back to the one before,
  with a warning), or a fresh start when there is none.
- never: a fresh start, in an OUT_DIR that holds no run yet (no checkpoints, no metrics.jsonl).
- PATH: a checkpoint file, or a run directory (its newest readable checkpoint); it may belong
  to another run. Run-only settings (RUN_ONLY) may differ from the checkpoint's config; any
  other difference would change the model or the optimisation and is refused.
- --max-steps may change, to extend a finished run or shorten a running one: the LR schedule
  is recomputed for the new length (optim.reschedule).
- The batch layout (--batch-size, --grad-accum-steps, --global-batch-size) and the world size
  may change as long as the global batch stays the same, e.g. a job requeued on half the GPUs
  with twice the accumulation. Model, optimizer, schedule and data position carry over, but
  per-rank RNG states cannot be mapped to other ranks: they are not restored (with a warning)
  and the run is no longer bitwise reproducible. Same world size: the resume is exact.

--init-from PATH (a checkpoint file or run directory) starts a new run from its model weights:
step 0, a fresh optimizer, schedule and data order, so --lr and the like may differ; the
settings that shape the model may not. Once OUT_DIR holds a checkpoint, --resume auto
continues it instead, so rerunning a fine-tuning command continues the fine-tuning.

A run owns its OUT_DIR (see lock.py): its checkpoints must not mix with another run's, since
--resume auto takes the newest, whoever wrote it, and rotation deletes the oldest. So
--resume never into an OUT_DIR that holds a run is refused, and so is --resume PATH when
OUT_DIR/checkpoints holds checkpoints of another run (PATH outside OUT_DIR) or of later steps.
"""

import random
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from . import dist, optim
from .checkpoint import Start, list_checkpoints, load, step_of, weights
from .config import ConfigError, TrainConfig, flag
from .model import build_model

# Settings that do not change what is computed, only where and how often it is written.
RUN_ONLY = {"out_dir", "resume", "init_from", "ckpt_every", "keep_last", "log_every"}
RUN_ONLY |= {"eval_every", "num_workers", "device", "dist_timeout", "detect_anomaly"}
BATCH_LAYOUT = {"batch_size", "grad_accum_steps", "global_batch_size"}
MAY_CHANGE = RUN_ONLY | BATCH_LAYOUT | {"max_steps"}  # on resume; see optim.reschedule
REQUIRED = {"model", "optimizer", "scheduler", "scaler", "step", "epoch", "position", "rng"}
REQUIRED |= {"config", "world_size"}
# Settings added after the first checkpoints were written: their value in those checkpoints.
ADDED = {"strategy": "ddp", "comm_hook": "none"}


def find_start(cfg: TrainConfig, world_size: int, device: torch.device) -> Start:
    """The checkpoint to resume, or the weights to start from, per --resume and --init-from."""
    state = find_resume(cfg, world_size, device)
    if state is not None:
        if cfg.init_from:
            dist.print0(f"--init-from {cfg.init_from} is not used: this run continues instead")
        return Start(resume=state)
    if cfg.init_from:
        return Start(weights=find_weights(cfg, device))
    return Start()


def find_resume(cfg: TrainConfig, world_size: int, device: torch.device) -> dict[str, Any] | None:
    """The checkpoint to resume from per --resume, checked against the config; None = fresh."""
    if cfg.resume == "never":
        check_out_dir_is_new(cfg.out_dir)
        return None
    explicit = cfg.resume != "auto"
    path = Path(cfg.resume if explicit else cfg.out_dir)
    found, problem = first_readable(path, REQUIRED, device)
    if found is None:
        if explicit:
            raise ConfigError(f"--resume {cfg.resume}: no readable checkpoint ({problem})")
        if problem != "none found":
            dist.print0(f"warning: no readable checkpoint in {path} ({problem}); starting afresh")
        return None
    candidate, state = found
    check_compatible(state, cfg, world_size, candidate)
    check_model_fits(state["model"], cfg, f"--resume {candidate}")
    if explicit:
        check_no_mixing(cfg, candidate, state["step"])
    dist.print0(f"resuming from {candidate} (step {state['step']})")
    note = optim.schedule_note(cfg, state["config"]["max_steps"], state["step"], world_size)
    if note:
        dist.print0(note)
    return state


def find_weights(cfg: TrainConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """--init-from: the model weights of a checkpoint, checked against this run's model."""
    found, problem = first_readable(Path(cfg.init_from), {"model", "config"}, device)
    if found is None:
        raise ConfigError(f"--init-from {cfg.init_from}: no readable checkpoint ({problem})")
    candidate, state = found
    what = f"--init-from {candidate}"
    differences = model_differences(state["config"], cfg)
    if differences:
        raise ConfigError(
            f"{what}: its model was built with other settings: {'; '.join(differences)}."
            " Settings that shape the model must match (--lr and the like may differ)"
        )
    check_model_fits(state["model"], cfg, what)
    dist.print0(
        f"starting from the weights of {candidate} (its step {state.get('step', '?')}):"
        " a new run at step 0, with a fresh optimizer, LR schedule and data order"
    )
    return weights(state)  # a sharded checkpoint (FSDP) is read whole here


def first_readable(
    path: Path, required: set[str], device: torch.device
) -> tuple[tuple[Path, dict[str, Any]] | None, str]:
    """The newest usable checkpoint at PATH (a file, or a run directory) and its state; or None,
    and what was wrong with the last one tried ("none found" when there were none)."""
    if path.is_file():
        candidates = [path]
    else:
        directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        candidates = list_checkpoints(directory)
    problem = "none found"
    for number, candidate in enumerate(candidates, start=1):
        try:
            state = load(candidate, device)
            check_structure(state, required)
        except Exception as err:  # truncated, empty, corrupt or not a checkpoint: try older
            problem = f"{candidate}: {_first_line(err)}"
            if number < len(candidates):
                dist.print0(f"warning: cannot read checkpoint {problem}; trying older ones")
            continue
        return (candidate, state), problem
    return None, problem


def check_structure(state: Any, required: set[str]) -> None:
    """Raise ValueError unless `state` has the entries and types that training reads."""
    if not isinstance(state, dict):
        raise ValueError(f"{type(state).__name__}, not a checkpoint")
    if not required <= state.keys():
        raise ValueError(f"missing {sorted(required - state.keys())}")
    kinds = {"model": dict, "config": dict, "optimizer": dict, "scheduler": dict, "scaler": dict}
    kinds |= {"step": int, "epoch": int, "position": int, "world_size": int, "rng": list}
    for key, kind in kinds.items():
        if key in required and not isinstance(state[key], kind):
            raise ValueError(f"'{key}' is {type(state[key]).__name__}, not {kind.__name__}")
    if not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise ValueError("'model' is not a state_dict (name -> tensor)")
    names = ("batch_size", "grad_accum_steps", "max_steps") if "optimizer" in required else ()
    for name in names:  # read by check_compatible and the schedule
        if not isinstance(state["config"].get(name), int):
            raise ValueError(f"'config' has no integer {name!r}")
    if "rng" in required:
        if len(state["rng"]) != state["world_size"]:
            raise ValueError(f"'rng' has {len(state['rng'])} entries, not one per rank")
        for rank, rng in enumerate(state["rng"]):
            try:  # set them on throwaway generators: the real ones are set after start-up
                random.Random().setstate(rng["python"])
                torch.Generator().set_state(rng["torch"].cpu())
                if not (rng["cuda"] is None or isinstance(rng["cuda"], torch.Tensor)):
                    raise TypeError(f"'cuda' is {type(rng['cuda']).__name__}")
            except Exception as err:
                raise ValueError(f"'rng' of rank {rank} is unusable ({_first_line(err)})") from None


def check_compatible(state: dict[str, Any], cfg: TrainConfig, world_size: int, path: Path) -> None:
    """Refuse to resume with settings that change the model or the optimisation."""
    saved, now = ADDED | state["config"], asdict(cfg)
    differences = [
        f"{flag(name)} {saved.get(name)!r} in the checkpoint, {now[name]!r} now"
        for name in now
        if name not in MAY_CHANGE and saved.get(name) != now[name]
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


def model_shapes(cfg: TrainConfig) -> dict[str, tuple[int, ...]] | None:
    """Parameter and buffer shapes of the model this config builds (None if unknown).

    Built on the meta device: shapes only, no memory and no time. A build_model that cannot
    run there (one that loads files, say) is left to load_state_dict's own check.
    """
    try:
        with torch.device("meta"):
            model = build_model(cfg)
    except Exception:
        return None
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def model_differences(saved: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """The settings in which `saved` differs from `cfg` and that change the model's shapes."""
    shapes, differences = model_shapes(cfg), []
    for name, now in asdict(cfg).items():
        if name in MAY_CHANGE or name not in saved or saved[name] == now:
            continue
        try:
            other = model_shapes(replace(cfg, **{name: saved[name]}))
        except ConfigError:  # a value this version no longer accepts: not a model setting
            continue
        if other != shapes:
            differences.append(f"{flag(name)} {saved[name]!r} in the checkpoint, {now!r} now")
    return differences


def check_model_fits(weights: dict[str, torch.Tensor], cfg: TrainConfig, what: str) -> None:
    """The checkpoint's weights have the names and shapes of the model this run builds."""
    expected = model_shapes(cfg)
    got = {name: tuple(tensor.shape) for name, tensor in weights.items()}
    if expected is None or got == expected:
        return
    problems = [f"missing {name}" for name in sorted(expected.keys() - got.keys())]
    problems += [f"unexpected {name}" for name in sorted(got.keys() - expected.keys())]
    problems += [
        f"{name} of shape {got[name]}, not {expected[name]}"
        for name in sorted(expected.keys() & got.keys())
        if got[name] != expected[name]
    ]
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    raise ConfigError(
        f"{what}: its model does not fit the model this run builds ({', '.join(problems[:3])}"
        f"{more}); was model.py changed since it was saved?"
    )


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
