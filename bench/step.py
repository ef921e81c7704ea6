"""The generated trainer's optimizer step against the same-work step, A/B in one process.

    python -m bench.step                      # 31 rounds of 10 steps per variant (~2 min idle)
    python -m bench.step --world-size 2       # two ranks in lock step (torchrun, gloo)

One process per rank, one thread each, gloo, the MLP workload of `python -m bench` (256 ->
3 x 1024 -> 10, batch 32, 4 micro-batches, fp32). Every variant trains its own copy of the same
model on the same in-memory batches (the data path is not compared here), and the variants
alternate within each round (on every rank in the same order), timed in rank 0's CPU seconds
and wall seconds: other processes taking turns on the cores cost the variants alike, which
resolves 1-2 % where separate runs differ by 5-15 %. CPU time does not see a rank waiting for
its peer (W=2), wall time does.

- same-work:  bench/loops.py's reference-same-work step, inline: no_sync on all micro-batches
              but the last, loss / 4, clip_grad_norm_, fused AdamW unless the norm is not
              finite, the warmup + cosine schedule, zero_grad.
- same-work-again: a second copy of same-work (its own model and optimizer): the A/A control,
              whose ratio shows what the method resolves and any bias of a variant's place.
- generated:  the trainer's step.train_step (keyed dropout's context, autocast, the loss sum,
              Health.note, the found_inf update).
- loop:       train_step and the rest of what train.py's loop does at every step when it logs
              nothing: Progress.advance, Meter.add, the agreement on stop and save requests
              (dist.AgreeLater), save-by-time and Due.after.
- generated-forward: the trainer's forward_backward, then the same-work update.
- generated-update:  the same-work micro-batches, then the trainer's update (Health.note,
              step.update with found_inf).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .harness import PACKAGE, Workload, run_worker, save_results, stamp

CLOCKS = ("cpu", "wall")
VARIANTS = ("same-work", "same-work-again", "generated", "loop", "generated-forward", "generated-update")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the project's environment: every variant's ms per step, round by round."""
    import torch
    import torch.distributed as torch_dist
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import TensorDataset

    from .loops import make_mlp, same_work_optimizer

    def project(name: str) -> Any:
        return importlib.import_module(f"{PACKAGE}.{name}")

    task_module, step, train = map(project, ("task", "step", "train"))
    nonfinite, metrics, dist, loading, loop = map(
        project, ("engine.nonfinite", "engine.metrics", "engine.dist", "engine.loading", "engine.loop")
    )
    torch.set_num_threads(1)
    if "RANK" in os.environ:  # torchrun: W ranks
        torch_dist.init_process_group("gloo")
    else:
        torch_dist.init_process_group("gloo", rank=0, world_size=1, store=torch_dist.HashStore())
    w, device = Workload(), torch.device("cpu")
    accum = w.grad_accum_steps
    sizes = dict(input_dim=w.input_dim, hidden_dim=w.hidden_dim, depth=w.depth)
    cfg = task_module.TrainConfig(
        **sizes, num_classes=w.num_classes, batch_size=w.batch_size, grad_accum_steps=accum,
        precision=w.precision, max_steps=10**6,
    )  # fmt: skip
    loop_args = argparse.Namespace(
        **sizes, num_classes=w.num_classes, weight_decay=cfg.weight_decay, lr=cfg.lr,
        warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, min_lr_ratio=cfg.min_lr_ratio,
    )  # fmt: skip
    task = task_module.Task(cfg)
    task.prepare(torch_dist.get_world_size(), stop=lambda: False)
    inputs = torch.randn(4096, w.input_dim, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, w.num_classes, (4096,), generator=torch.Generator().manual_seed(2))
    env = dist.DistEnv(rank=torch_dist.get_rank(), local_rank=0, world_size=torch_dist.get_world_size())
    global_batch = w.batch_size * accum * env.world_size
    sampler = loading.ResumableSampler(TensorDataset(inputs, labels), env, cfg.seed, global_batch)

    def feed():
        for i in range(10**9):
            start = i * w.batch_size % len(inputs)
            yield inputs[start : start + w.batch_size], labels[start : start + w.batch_size]

    def window(batches: Any) -> Any:
        """The trainer's next optimizer step: accum micro-batches and their samples' places."""
        return loading.Window(batches, sampler, w.batch_size, accum)

    def forward(model: nn.Module, n: int) -> torch.Tensor:
        return task.loss(model, loading.copies((inputs[0], labels[0]), n, device))

    def same_forward(ddp: nn.Module, batches: Any) -> torch.Tensor:
        """The same-work micro-batches: no_sync on all but the last, loss / accum."""
        for micro in range(accum):
            x, y = next(batches)
            with ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext():
                loss = F.cross_entropy(ddp(x).flatten(0, -2), y.flatten())
                (loss / accum).backward()
        return loss

    def same_update(ddp: nn.Module, optimizer: Any, scheduler: Any) -> None:
        """The same-work update: clip, step unless the norm is not finite, schedule, zero."""
        grad_norm = nn.utils.clip_grad_norm_(ddp.parameters(), cfg.grad_clip)
        if grad_norm.isfinite():
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    class SameWork:
        def __init__(self) -> None:
            torch.manual_seed(0)
            model = make_mlp(loop_args)
            self.ddp = nn.parallel.DistributedDataParallel(model)
            self.optimizer, self.scheduler = same_work_optimizer(model, loop_args)
            self.batches = feed()

        def step(self) -> None:
            same_forward(self.ddp, self.batches)
            same_update(self.ddp, self.optimizer, self.scheduler)

    class Generated:
        def __init__(self) -> None:
            self.state = train.build_state(cfg, task, env.world_size, device, forward)
            self.health = nonfinite.Health(device, scaler_skips=False)
            self.batches, self.meter = feed(), metrics.Meter()
            self.requests, self.scaler = dist.AgreeLater("stop", "save_due"), self.state.scaler
            self.model, self.progress = self.state.model, self.state.progress

        def step(self) -> None:
            step.train_step(self.model, self.state, window(self.batches), task, cfg, self.health)
            self.progress.step += 1

        def loop(self) -> None:  # train.py's per-step work when the step logs nothing
            out = step.train_step(self.model, self.state, window(self.batches), task, cfg, self.health)
            self.progress.advance(w.batch_size * accum, end_of_epoch=False)
            self.meter.add(w.batch_size * accum, out.started, out.data_wait)
            asked = self.requests.result()
            self.requests.start(stop=0, save_due=0)
            loop.Due.after(self.progress.step, cfg, **asked)

        def forward(self) -> None:  # the trainer's micro-batches, the same-work update
            key = (cfg.seed, self.progress.step)
            step.forward_backward(self.model, window(self.batches), task, cfg.precision, self.scaler, key)
            same_update(self.model, self.state.optimizer, self.state.scheduler)
            self.progress.step += 1

        def update(self) -> None:  # the same-work micro-batches, the trainer's update
            loss = same_forward(self.model, self.batches)
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.health.note(self.progress.step + 1, loss.detach(), grad_norm)
            step.update(self.state.optimizer, self.scaler, grad_norm)
            self.state.scheduler.step()
            self.state.optimizer.zero_grad(set_to_none=True)
            self.progress.step += 1

    same, again = SameWork(), SameWork()
    gens = {v: Generated() for v in VARIANTS[1:]}  # a model of its own each, the same weights
    run = {
        "same-work": same.step,
        "same-work-again": again.step,
        "generated": gens["generated"].step,
        "loop": gens["loop"].loop,
        "generated-forward": gens["generated-forward"].forward,
        "generated-update": gens["generated-update"].update,
    }
    for variant in VARIANTS:  # warm-up
        for _ in range(3):
            run[variant]()
    ms: dict[str, dict[str, list[float]]] = {c: {v: [] for v in VARIANTS} for c in CLOCKS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            torch_dist.barrier()
            started = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                run[variant]()
            ended = time.process_time(), time.perf_counter()
            for clock, a, b in zip(CLOCKS, started, ended, strict=True):
                ms[clock][variant].append(1000 * (b - a) / args.steps)
    torch_dist.destroy_process_group()
    results: dict[str, Any] = {"world_size": int(os.environ.get("WORLD_SIZE", 1))}
    for clock, times in ms.items():
        base = times["same-work"]
        ratios = {v: [a / b for a, b in zip(times[v], base, strict=True)] for v in VARIANTS}
        results[clock] = {
            "ms": times,
            "median_ms": {v: statistics.median(x) for v, x in times.items()},
            "ratios_to_same_work": ratios,
            "median_ratio": {v: statistics.median(x) for v, x in ratios.items()},
        }
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.step", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per variant per round")
    p.add_argument("--world-size", type=int, default=1, help="ranks, launched by torchrun")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.worker:
        results = worker(args)
        if os.environ.get("RANK", "0") == "0":
            print(json.dumps(results))
        return 0
    results = run_worker("bench.step", argv if argv is not None else sys.argv[1:], world_size=args.world_size)
    if results is None:
        return 1
    print(f"one optimizer step at W={args.world_size}, rank 0: median ms of {args.rounds} rounds, and")
    print("x same-work (the median of per-round ratios; its quartiles), in CPU and wall time:")
    for variant in VARIANTS:
        line = f"  {variant:<18}"
        for clock in CLOCKS:
            r = results[clock]
            ratios = sorted(r["ratios_to_same_work"][variant])
            q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
            line += f"  {clock} {r['median_ms'][variant]:6.2f} ms x {r['median_ratio'][variant]:.3f}"
            line += f" ({q1:.3f}-{q3:.3f})"
        print(line)
    path = save_results("step", {**stamp("python -m bench.step", argv), "results": results}, args.json)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
