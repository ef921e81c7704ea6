"""The engine: everything that makes a run distributed, exact and safe, whatever the task.

It imports nothing of the project's own files (task.py, model.py, data.py); train.py and
step.py hand it the task (hooks.Task). Where to look, by what you see:

    a flag or --config key, its check     config.py, cli.py, options.py
    ranks that do not meet, a hang        dist.py, rendezvous.py (docs/faults.md)
    which samples a rank reads, resume    loading.py (ResumableSampler), state.py
    a loader worker that hangs or dies    workers.py, loading.py (worker_lost)
    a checkpoint refused on resume        resume.py, verify.py (docs/checkpoints.md)
    checkpoint files, their writes        checkpoint.py, files.py, paths.py
    "another run holds --out-dir"         runlock.py, lock.py
    NaN or inf loss, skipped steps        nonfinite.py
    SIGTERM, Ctrl-C, exit statuses        preemption.py, loop.py
    metrics.jsonl and the console line    metrics.py
    the LR schedule, the optimizer        optim.py
    DDP, no_sync, the wrapped model       parallel.py
    dropout that differs across ranks     keyed.py (docs/testing.md)
    "random draws that are not keyed"     unkeyed.py
    --keep-best                           best.py
    what the engine asks of a task        hooks.py
"""
