"""The names of what a run writes in its OUT_DIR, in one place: every module that reads or
writes them (checkpoint, lock, metrics, resume, best) imports them from here."""

import re
from pathlib import Path

CONFIG = "config.toml"  # the run's settings (cli.write_settings)
METRICS = "metrics.jsonl"  # a JSON object per logged step (metrics.Logger)
CHECKPOINTS = "checkpoints"  # step_00000100.pt ... (checkpoint.py)
BEST = "best.pt"  # --keep-best (best.py)
LOCK = "run.lock"  # who owns the directory (runlock.py)
CHECKPOINT_NAME = re.compile(r"step_(\d+)\.pt")


def checkpoint_dir(out_dir: str | Path) -> Path:
    """Where a run keeps its checkpoints: OUT_DIR/checkpoints."""
    return Path(out_dir) / CHECKPOINTS


def checkpoint_name(step: int) -> str:
    """The file name of step `step`'s checkpoint: step_00000100.pt."""
    return f"step_{step:08d}.pt"
