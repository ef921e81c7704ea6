"""OUT_DIR/run.lock, a lock.LockFile: one run at a time per --out-dir (docs/checkpoints.md)."""

import os
import sys
from pathlib import Path
from typing import Any

from . import dist, paths
from .lock import LockFile, describe, read_lock, stale_reason, this_process
from .options import ConfigError


def in_use_message(out_dir: str, holder: dict[str, Any] | None) -> str:
    """Why a run is refused while another holds `out_dir`."""
    in_use = f"--out-dir {out_dir} is in use by another run ({describe(holder)})"
    return f"{in_use}; wait for it to finish or use another --out-dir"


def check_free(out_dir: str) -> None:
    """Any rank, before the process group: a live run.lock refuses the run at once (acquire
    decides). Not on several nodes: ranks on other hosts than the holder's would disagree."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", 1)) < int(os.environ.get("WORLD_SIZE", 1)):
        return
    found = read_lock(Path(out_dir) / paths.LOCK)
    if found is not None and stale_reason(*found, this_process()) is None:
        raise ConfigError(in_use_message(out_dir, found[0]))


def output_snapshot(out_dir: str) -> tuple[list[str], int]:
    """What runs leave in OUT_DIR: checkpoint names and the size of metrics.jsonl (-1: none)."""
    names = sorted(p.name for p in paths.checkpoint_dir(out_dir).glob("step_*.pt"))
    metrics = Path(out_dir) / paths.METRICS
    return names, metrics.stat().st_size if metrics.exists() else -1


class RunLock(LockFile):
    """OUT_DIR/run.lock, held by rank 0 from acquire() to release(). `snapshot`: OUT_DIR when
    --resume was decided (output_snapshot); if another run wrote there since, refused too."""

    def __init__(self, out_dir: str, is_main: bool, snapshot: tuple[list[str], int]) -> None:
        super().__init__(Path(out_dir) / paths.LOCK)
        self.out_dir, self.is_main, self.snapshot = out_dir, is_main, snapshot

    def acquire(self) -> bool:
        """Rank 0 takes the lock; False on every rank if refused (rank 0 says why). A collective."""
        refusal = None
        try:
            if self.is_main:  # rank 0's file I/O only
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if (found := self.take()) is not None:
                    refusal = in_use_message(self.out_dir, found[0])
                elif output_snapshot(self.out_dir) != self.snapshot:
                    self.release()
                    wrote = "another run wrote to it while this one started"
                    refusal = f"--out-dir {self.out_dir}: {wrote}"
        except OSError as err:  # a read-only or missing file system, say
            refusal = f"--out-dir {self.out_dir}: cannot create {self.path}: {err}"
        refused = any(dist.all_gather_object(refusal))  # every rank calls it
        if refusal:
            print(f"error: {refusal}", file=sys.stderr, flush=True)
        return not refused
