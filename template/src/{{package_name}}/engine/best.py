"""--keep-best: OUT_DIR/best.pt, the checkpoint of the best evaluation loss so far.

best.pt is a checkpoint like the others, written by the same save as that step's step_N.pt
(Checkpointer.also) and before it. It lies outside checkpoints/, so neither --resume auto nor
the rotation ever sees it. Every checkpoint records the loss of best.pt (best_eval_loss), which
a resumed run must beat before it replaces it.
"""

import math
from pathlib import Path
from typing import Any

from . import paths
from .checkpoint import Checkpointer


def best_path(out_dir: str) -> Path:
    return Path(out_dir) / paths.BEST


class KeepBest:
    """Decides which evaluations make best.pt; the saver writes it with the step's checkpoint."""

    def __init__(self, saver: Checkpointer, resumed: dict[str, Any] | None) -> None:
        self.saver = saver
        self.loss = resumed.get("best_eval_loss", math.inf) if resumed else math.inf
        saver.extra["best_eval_loss"] = self.loss  # in every checkpoint: what to beat

    def improves(self, eval_loss: float) -> bool:
        """Does `eval_loss` beat best.pt's? Then the next save also writes best.pt. The same
        answer on every rank: the loss is all-reduced."""
        if not eval_loss < self.loss:  # NaN never improves
            return False
        self.loss = self.saver.extra["best_eval_loss"] = eval_loss
        self.saver.also = [best_path(self.saver.cfg.out_dir)]
        return True
