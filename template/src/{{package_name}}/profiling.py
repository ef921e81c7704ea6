"""--profile: torch.profiler over a few training steps, once the run has warmed up.

The first steps are not typical (memory allocation, kernel selection, the data loader starting),
so the profiler waits WAIT steps, then runs WARMUP steps whose records it throws away (its own
start-up cost), then records ACTIVE steps. Every rank writes its trace to
OUT_DIR/profile/rank<N>.<...>.pt.trace.json: open it in https://ui.perfetto.dev (or
chrome://tracing), or with TensorBoard's profiler plugin (torch-tb-profiler). Comparing the ranks'
traces shows stragglers and how long each waited in the all-reduce.

Rank 0 prints the operators that took the most time and, on CUDA, how often per step the host
waited for the GPU. Each such sync (`.item()`, `print(tensor)`, a copy to the CPU) stops the
CPU from queueing kernels ahead: the loop has none on steps that neither log, evaluate nor
save; any there point at a `.item()` or a data-dependent shape in the model or the loss.
"""

from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WAIT, WARMUP, ACTIVE = 5, 2, 5  # optimizer steps: the trace covers steps 8 to 12
SYNC_EVENTS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
TOP = 15  # operators in the table


class NoProfiler:
    """What the loop steps when --profile is off: nothing."""

    def step(self) -> None:
        pass

    def close(self) -> None:
        pass


class StepProfiler(NoProfiler):
    """Profile steps WAIT + WARMUP + 1 to WAIT + WARMUP + ACTIVE of this run (every rank).

    Call step() after every optimizer step, and close() at the end of the run, also on errors.
    """

    def __init__(
        self, out_dir: str, rank: int, device: torch.device, report: Callable[[str], None]
    ) -> None:
        self.directory = Path(out_dir) / "profile"
        self.rank, self.device, self.report, self.steps = rank, device, report, 0
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
            on_trace_ready=self._save,
        )
        self.profiler.start()

    def step(self) -> None:
        self.steps += 1
        self.profiler.step()

    def close(self) -> None:
        self.profiler.stop()  # a run that ends while recording still saves what it recorded
        if self.steps <= WAIT + WARMUP:
            self.report(
                f"--profile: the run ended after {self.steps} steps, before the profiled ones"
                f" (steps {WAIT + WARMUP + 1} to {WAIT + WARMUP + ACTIVE}); nothing recorded"
            )

    def _save(self, prof: profile) -> None:
        try:
            tensorboard_trace_handler(str(self.directory), worker_name=f"rank{self.rank}")(prof)
        except (OSError, RuntimeError) as err:  # a full disk: the trace is lost, not the run
            self.report(f"warning: --profile: cannot write the trace in {self.directory}: {err}")
            return
        steps = min(ACTIVE, self.steps - WAIT - WARMUP)
        self.report(summary(prof, self.device, steps, self.directory))


def summary(prof: profile, device: torch.device, steps: int, directory: Path) -> str:
    """The top operators by their own time (on the GPU when there is one), and syncs per step."""
    on_gpu = device.type == "cuda"

    def self_time(event: object) -> float:  # microseconds, summed over the profiled steps
        return getattr(event, "self_device_time_total" if on_gpu else "self_cpu_time_total")

    # ProfilerStep#N spans a whole step: it is the sum of the operators, not one of them.
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    total = sum(self_time(e) for e in events) or 1.0
    where = "GPU" if on_gpu else "CPU"
    lines = [
        f"profile of {steps} steps, one trace per rank in {directory} (https://ui.perfetto.dev)",
        f"{'operator':<52} {'self ' + where + ' ms/step':>17} {'share':>7} {'calls/step':>11}",
    ]
    for event in sorted(events, key=self_time, reverse=True)[:TOP]:
        lines.append(
            f"{event.key[:52]:<52} {self_time(event) / 1e3 / steps:>17.3f}"
            f" {100 * self_time(event) / total:>6.1f}% {event.count / steps:>11.1f}"
        )
    if on_gpu:
        syncs = {e.key: e.count for e in events if e.key in SYNC_EVENTS}
        detail = ", ".join(f"{name} {count}" for name, count in syncs.items()) or "none"
        lines.append(f"host-device syncs: {sum(syncs.values()) / steps:.1f} per step ({detail})")
    else:
        lines.append("host-device syncs: not applicable on CPU (there is no device to wait for)")
    return "\n".join(lines)


def build(
    enabled: bool, out_dir: str, rank: int, device: torch.device, report: Callable[[str], None]
) -> NoProfiler:
    """A profiler for --profile, a do-nothing stand-in otherwise."""
    return StepProfiler(out_dir, rank, device, report) if enabled else NoProfiler()
