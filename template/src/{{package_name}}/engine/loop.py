"""The training loop's bookkeeping (train.py): its plan, what is due after a step, and how a run
ends."""

from dataclasses import dataclass

import torch

from . import dist
from .checkpoint import Checkpointer, newest_note
from .config import RunConfig, global_batch, steps_per_epoch
from .metrics import Logger
from .options import ConfigError
from .preemption import Preemption

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2  # and Preemption.EXIT_STATUS: 129, 130, 143


def plan(cfg: RunConfig, world_size: int, samples: int, step: int) -> str:
    """The line a run prints before its first step: how many steps of what, from where."""
    batch, resuming = global_batch(cfg, world_size), f"; from step {step + 1}" if step else ""
    return (
        f"training: {cfg.max_steps} steps of {batch} samples ({world_size} x {cfg.batch_size}"
        f" x {cfg.grad_accum_steps}), {steps_per_epoch(cfg, samples, world_size)} steps an epoch"
        f"{resuming}"
    )


@dataclass
class Due:
    """What follows an optimizer step: the run's periodic decisions, all in one place."""

    last: bool = False  # the step --max-steps asks for
    evaluate: bool = False
    save: bool = False
    log: bool = False  # every step that evaluates or saves also logs
    stop: int = 0  # a Preemption reason all ranks agreed on: save this step, then exit

    @classmethod
    def after(cls, step: int, cfg: RunConfig, stop: int, save_due: int) -> "Due":
        def every(k: int) -> bool:
            return k > 0 and step % k == 0

        last = step == cfg.max_steps
        evaluate = last or every(cfg.eval_every)
        # A stop request (SIGTERM, Ctrl-C) saves this step, so the rerun loses nothing.
        save = last or bool(stop) or bool(save_due) or every(cfg.ckpt_every)
        log = evaluate or save or every(cfg.log_every)
        return cls(last, evaluate, save, log, stop=0 if last else stop)


def writes_failed(log: Logger, saver: Checkpointer) -> str:
    """Why rank 0 stopped writing (a full disk, its run.lock taken over), on every rank; ''
    if all is well. A collective: rank 0 does the writing, every rank stops on its word."""
    return dist.from_main(log.problem or saver.problem or "")


def outcome(log: Logger, step: int, out_dir: str, failed: str, problem: str, stop: int) -> int:
    """The exit status, and the lines that say why a run ended early."""
    if problem:  # a non-finite loss or gradient
        log.error(problem)
    if failed:  # a write on rank 0
        log.error(f"{failed}; all ranks stopped at step {step}, and {newest_note(out_dir)}")
    if problem or failed:
        return EXIT_FAILED
    if stop:
        status = Preemption.EXIT_STATUS[stop]
        log.info(f"{Preemption.WHY[stop]}: saved step {step}; rerun to resume. Exit {status}.")
        return status
    return EXIT_OK


def stopped_preparing(preemption: Preemption, rank: int) -> int:
    """A stop request (SIGTERM, Ctrl-C) while the data was prepared: nothing trained."""
    status = Preemption.EXIT_STATUS[preemption.reason]
    if rank == 0:
        why = f"{Preemption.WHY[preemption.reason]}: stopped while preparing the data"
        print(f"{why}, nothing trained; rerun to convert it again. Exit {status}.", flush=True)
    return status


def check_compile(enabled: bool) -> None:
    """--compile where torch cannot compile (a Python newer than this torch, say): one line."""
    if not enabled:
        return
    try:
        torch._dynamo.eval_frame.check_if_dynamo_supported()
    except RuntimeError as err:
        raise ConfigError(f"--compile is not available here: {err}") from None
