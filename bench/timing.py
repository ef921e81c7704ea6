"""One clock for every contender: a global optimizer-step hook, and the result line.

Every contender (the generated trainer included, unmodified) runs with `StepClock` installed.
It is a global `torch.optim` step post-hook, so it sees each real optimizer update no matter
which wrapper (DDP loop, Accelerate's AcceleratedOptimizer, Fabric's _FabricOptimizer) called
it. Only updates of the plain optimizer class are counted (wrappers that subclass Optimizer
would otherwise count twice).

Timed window: from the end of optimizer step `warmup` to the end of step `warmup + timed`.
It holds exactly `timed` optimizer steps, each with everything the loop does around it: data
loading, forward/backward, all-reduce, the update, and logging, evaluation and checkpoints
at their configured intervals. The first `warmup` steps (allocator, thread pools, first-epoch
effects) and anything after the window (a trainer's final eval and checkpoint) are excluded.
Throughput = timed x global batch / window seconds, on rank 0 (ranks are in lock step: every
step ends with a collective). A second figure divides by rank 0's CPU seconds in the window
instead (time.process_time: all threads of the process): on a shared machine it varies far
less than wall time, but it leaves out time spent waiting (for peers, for the disk).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

RESULT_PREFIX = "BENCH_RESULT "


class StepClock:
    """Timestamps at the end of every optimizer step.

    On a GPU the host runs ahead of the device, so at the two window edges (and only there,
    to add no syncs elsewhere) the clock waits for the device before reading the time.
    """

    def __init__(self, warmup: int, timed: int, optimizer_type: type = torch.optim.AdamW) -> None:
        if warmup < 1 or timed < 1:
            raise ValueError("warmup and timed must be at least 1")
        self.warmup, self.timed = warmup, timed
        self.optimizer_type = optimizer_type
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # CPU seconds of this process (all its threads)
        self.faults: list[int] = []  # minor page faults of this process so far
        self._handle = register_optimizer_step_post_hook(self._hook)

    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if type(optimizer) is not self.optimizer_type:
            return
        if len(self.times) + 1 in (self.warmup, self.warmup + self.timed):
            device = optimizer.param_groups[0]["params"][0].device
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        self.times.append(time.perf_counter())
        self.cpu_times.append(time.process_time())
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)

    def remove(self) -> None:
        self._handle.remove()

    def result(self, global_batch: int) -> dict[str, Any]:
        """Samples/s over the window; raises if the contender did not make enough steps."""
        warmup, timed = self.warmup, self.timed
        if len(self.times) < warmup + timed:
            raise RuntimeError(
                f"saw {len(self.times)} optimizer steps, need warm-up {warmup} + timed {timed}"
            )
        seconds = self.times[warmup + timed - 1] - self.times[warmup - 1]
        cpu_seconds = self.cpu_times[warmup + timed - 1] - self.cpu_times[warmup - 1]
        return {
            "samples_per_sec": timed * global_batch / seconds,
            "window_s": seconds,
            # The same samples over this rank's CPU seconds instead of wall seconds: what the
            # rate would be with the cores to itself and free waits. Robust to other processes
            # taking turns on the cores; blind to communication latency and I/O waits.
            "cpu_samples_per_sec": timed * global_batch / cpu_seconds,
            "window_cpu_s": cpu_seconds,
            # Page faults per step: large tensors that malloc serves by mmap/munmap fault in
            # fresh zeroed pages on every allocation, a hidden per-process cost on CPU.
            "page_faults_per_step": (self.faults[warmup + timed - 1] - self.faults[warmup - 1]) / timed,
            "timed_steps": timed,
            "warmup_steps": warmup,
            "optimizer_steps_seen": len(self.times),
            "global_batch": global_batch,
            "threads": torch.get_num_threads(),
            "world_size": int(os.environ.get("WORLD_SIZE", 1)),
        }


class Timers:
    """Wall time and call counts per component, counted only inside the clock's timed window.

    A wrapped call made inside another (a save that builds the state it writes) counts once: its
    seconds are its own component's, and not also the caller's. Wrapped calls are expected on
    one thread, the training loop's.
    """

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.syncs: dict[str, int] = collections.defaultdict(int)
        self._nested: list[float] = []  # per timed call in progress: seconds of timed calls inside it

    def active(self) -> bool:
        # Steps warmup+1 .. warmup+timed: after `warmup` optimizer steps, before the window ends.
        warmup, timed = self.clock.warmup, self.clock.timed
        return warmup <= len(self.clock.times) < warmup + timed

    def wrap(self, owner: Any, attr: str, name: str, data_wait_from_result: bool = False) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active():
                return original(*args, **kwargs)
            self._nested.append(0.0)
            started = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - started
                inner = self._nested.pop()
            if self._nested:  # the caller is timed too: this call is not the caller's own time
                self._nested[-1] += seconds
            seconds -= inner
            if data_wait_from_result:  # forward_backward returns (loss, seconds waiting for data)
                self.seconds["data (next(batches))"] += result[1]
                seconds -= result[1]
            self.seconds[name] += seconds
            self.calls[name] += 1
            return result

        setattr(owner, attr, timed)

    def count(self, owner: Any, attr: str, name: str) -> None:
        """Count calls per caller (file:function), e.g. Tensor.item from AdamW's step counter."""
        original = getattr(owner, attr)

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.active():
                caller = sys._getframe(1).f_code
                where = f"{Path(caller.co_filename).parent.name}/{Path(caller.co_filename).name}"
                self.syncs[f"{name} in {where}:{caller.co_name}"] += 1
            return original(*args, **kwargs)

        setattr(owner, attr, counted)


def emit(record: dict[str, Any]) -> None:
    """Print the result line the driver parses (rank 0 only)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(RESULT_PREFIX + json.dumps(record), flush=True)


def parse(stdout: str) -> dict[str, Any] | None:
    """The last result line in a contender's output, or None."""
    found = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            found = json.loads(line[len(RESULT_PREFIX) :])
    return found
