"""Generated trainer vs hand-written DDP, Accelerate and Fabric on one GPU: samples/s, TFLOP/s.

    bash bench/gpu.sh                                   # on a CUDA machine, about 10 minutes
    python -m bench.gpu --device cpu --tiny             # smoke test of this script on CPU

World size 1 under torchrun, bf16 autocast, the same timing method as `python -m bench`
(bench/timing.py), interleaved rounds. Workloads (--workloads):
- launch:  MLP 1024-4096x8-10 (122 M parameters), batch 256 x 4 micro-steps: small kernels, so
           the host (Python, data loading, syncs) decides the speed;
- compute: MLP 1024-8192x4-10 (210 M parameters), batch 4096 x 2: large matmuls, so the GPU does.
- gpt2:    the project rendered with task=lm at GPT-2 small's shape (12 blocks, width 768,
           12 heads, context 1024; 85 M parameters with byte tokens: GPT-2's tokenizer needs
           files this offline machine may not have), batch 16 x 2 windows, on
           2 MB of its shipped text repeated; the hand-written loop (bench/lm_loop.py) trains the
           same GPT class.
Achieved TFLOP/s = FLOPs per sample x samples/s / 1e12: 6 x parameters for the MLP (forward 2,
backward 4 FLOPs per parameter and sample; the GELUs and the loss are ignored), and for the GPT
seq_len x (6 N + 12 n_layer d_model seq_len), the generated model's own count; printed next to
the rate of a bf16 8192^3 matmul measured in the same run (the chip's practical ceiling) and, for
the GPT, as MFU: a share of the data sheet's dense bf16 peak (989 TFLOP/s on H100/H200 SXM).

With the gpt2 workload it also measures what the trainer's attention costs with --dropout
(keyed masks: the weights' dropout written out, a (B, H, T, T) tensor per step of it) against
F.scaled_dot_product_attention(dropout_p=...) (torch's masks, a fused kernel): the peak memory
of one micro-batch's forward + backward at the workload's shape, the bytes autograd keeps for
the backward, and the time (`attention_memory`; on CPU only the saved bytes mean something).

Contenders: reference (bench/loops.py, fused AdamW), generated (defaults: metrics every 10 steps,
evaluation and a checkpoint every 100, so the window holds one of each), generated-quiet (none of
them in the window), generated-compile (defaults plus --compile, when the trainer has it),
accelerate and fabric (when installed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .generated import render
from .harness import (
    OPTIONAL,
    PACKAGE,
    Workload,
    environment,
    fmt,
    installed,
    lm_data,
    run_rounds,
    save_results,
    stamp,
    summarize,
)

WORKLOADS = {
    "launch": Workload(
        input_dim=1024, hidden_dim=4096, depth=8, batch_size=256, grad_accum_steps=4, num_samples=32768
    ),
    "compute": Workload(
        input_dim=1024, hidden_dim=8192, depth=4, batch_size=4096, grad_accum_steps=2, num_samples=65536
    ),
    "gpt2": Workload(
        task="lm", seq_len=1024, n_layer=12, n_head=12, d_model=768, batch_size=16, grad_accum_steps=2
    ),
}
LM_WINDOWS = 2048  # training windows of the gpt2 workload's text: 64 steps of 32 per epoch
LM_CONTENDERS = {"reference", "generated", "generated-quiet", "generated-compile"}
TARGETS = {"generated": 0.97, "generated-quiet": 1.00}  # x reference, on every workload
MATMUL_TARGET = 0.6  # compute workload: generated at >= 0.6 of the matmul rate
MFU_TARGET = 0.40  # gpt2 workload with --compile: llm.c's GPT-2 124M reaches about 40 % on an H100


def matmul_tflops(device: str, n: int = 8192, repeats: int = 50) -> float | None:
    """TFLOP/s of a bf16 n x n x n matmul on this GPU (None on CPU)."""
    if device != "cuda":
        return None
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(5):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n**3 * repeats / (start.elapsed_time(end) / 1e3) / 1e12


def trainer_has_compile(env: dict[str, str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.train", "--help"], env=env, capture_output=True, text=True
    )
    return "--compile" in done.stdout


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--attention-memory-worker"]:  # one attention_memory run, in its own process
        config = json.loads(argv[1])
        attention, device, precision = config.pop("attention"), config.pop("device"), config.pop("precision")
        w = Workload(**config)
        print(json.dumps(attention_memory(PACKAGE, w, device, precision, attention)))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--workloads", default="launch,compute,gpt2", help=f"any of {', '.join(WORKLOADS)}")
    p.add_argument(
        "--peak-tflops", type=float, help="one GPU's dense bf16 peak for MFU (default: known GPUs)"
    )
    p.add_argument("--num-workers", type=int, default=8, help="DataLoader workers (every contender)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--timed", type=int, default=100, help="100 holds the default eval + checkpoint")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS (default 4 on cuda, 1 on cpu)")
    p.add_argument("--contenders", help="comma-separated (default: all available)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU smoke test")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    workloads = {}
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            p.error(f"--workloads: unknown {name!r}; choose from {', '.join(WORKLOADS)}")
        w = replace(WORKLOADS[name], warmup=args.warmup, timed=args.timed, device=args.device)
        w = replace(w, precision=args.precision, num_workers=args.num_workers)
        if args.tiny:
            w = replace(w, input_dim=32, hidden_dim=64, depth=2, batch_size=8, num_samples=512)
            w = replace(w, warmup=2, timed=5, num_workers=0)
            w = replace(w, seq_len=32, n_layer=2, n_head=2, d_model=32, batch_size=4)
        workloads[name] = w
    threads = args.threads or (4 if args.device == "cuda" else 1)
    work = Path(tempfile.mkdtemp(prefix="ddp-bench-gpu-"))
    try:
        envs: dict[str, dict[str, str]] = {}  # one rendered project per task
        for task in sorted({w.task for w in workloads.values()}):
            project = work / f"project-{task}"
            render(project, PACKAGE, data={"task": task})
            envs[task] = environment(threads, project)
            if task == "lm":
                seq_len = next(w.seq_len for w in workloads.values() if w.task == "lm")
                data = lm_data(project, work, seq_len, LM_WINDOWS)
                for name, w in workloads.items():
                    if w.task == "lm":
                        workloads[name] = replace(w, **data)
        lm = next((w for w in workloads.values() if w.task == "lm"), None)
        memory = attention_memory_runs(lm, envs["lm"], args.device, args.precision) if lm else None
        peak = matmul_tflops(args.device)
        if peak:
            print(f"bf16 8192^3 matmul: {peak:.0f} TFLOP/s (this run's ceiling)", flush=True)
        datasheet = args.peak_tflops or datasheet_peak(args.device)
        results = {}
        for name, w in workloads.items():
            env = envs[w.task]
            contenders = choose_contenders(args.contenders, env)
            if w.task == "lm":  # Accelerate and Fabric run only the MLP (bench/loops.py)
                contenders = [c for c in contenders if c in LM_CONTENDERS]
            print(f"\nworkload {name}: {describe(w)}", flush=True)
            runs = run_rounds(contenders, [1], args.repeats, w, env, work, log=lambda m: print(m, flush=True))
            results[name] = report(name, w, runs, contenders, peak, args.repeats, datasheet)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        **stamp("python -m bench.gpu", argv),
        "matmul_tflops": peak,
        "datasheet_peak_tflops": datasheet,
        "threads_per_process": threads,
        "workloads": results,
        "attention_memory": memory,
    }
    path = save_results("gpu", result, args.json)
    print(f"\nresults: {path}")
    failed = [r for w in results.values() for r in w["runs"] if "error" in r]
    return 1 if failed else 0


DROPOUT = 0.1  # GPT-2's


def attention_memory(
    package: str, w: Workload, device: str, precision: str, attention: str
) -> dict[str, Any]:
    """One micro-batch's forward + backward of the project's GPT at workload w's shape with
    --dropout 0.1, its dropouts keyed as in training; attention "written-out" (the project's),
    "sdpa" (F.scaled_dot_product_attention with dropout_p, torch's masks, as bench/lm_loop.py's
    reference-same-work) or "no-dropout" (SDPA, nothing dropped). Peak memory above the model
    and its gradients (CUDA only), bytes saved for the backward, and milliseconds per pass."""
    import time

    import torch
    import torch.nn.functional as F

    from .lm_loop import sdpa_attention

    keyed = importlib.import_module(f"{package}.engine.keyed")
    gpt = importlib.import_module(f"{package}.model").GPT
    dropout = 0.0 if attention == "no-dropout" else DROPOUT
    torch.manual_seed(0)
    model = keyed.convert_dropout(gpt(w.n_layer, w.n_head, w.d_model, w.seq_len, 256, dropout=dropout))
    model = model.to(device).train()
    if attention == "sdpa":
        for module in model.modules():
            if type(module).__name__ == "CausalSelfAttention":
                module.forward = sdpa_attention.__get__(module)
    tokens = torch.randint(0, 256, (w.batch_size, w.seq_len), device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def step(count_saved: bool) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t)
        with keyed.batch(model, 0, 1, range(w.batch_size), torch.device(device)):
            with (
                torch.autocast(device, dtype=dtype, enabled=precision != "fp32"),
                hooks if count_saved else nullcontext(),
            ):
                loss = F.cross_entropy(model(tokens).flatten(0, -2).float(), tokens.flatten())
            loss.backward()

    step(False)  # gradients allocated; warm-up
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    started = time.perf_counter()
    repeats = 3
    for _ in range(repeats):
        step(False)
    if cuda:
        torch.cuda.synchronize()
    ms = 1000 * (time.perf_counter() - started) / repeats
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    step(True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "attention": attention,
        "peak_bytes": peak,
        "saved_bytes": sum(saved.values()),
        "ms": ms,
        "param_bytes": params,
    }


def attention_memory_runs(
    w: Workload, env: dict[str, str], device: str, precision: str
) -> list[dict[str, Any]]:
    """attention_memory for each attention, each in a fresh process (a clean peak); printed."""
    print(
        f"\nattention with --dropout {DROPOUT} at the gpt2 shape ({describe(w)}; one micro-batch's"
        " forward + backward):",
        flush=True,
    )
    rows = []
    for attention in ("written-out", "sdpa", "no-dropout"):
        config = {**asdict(w), "attention": attention, "device": device, "precision": precision}
        cmd = [sys.executable, "-m", "bench.gpu", "--attention-memory-worker", json.dumps(config)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            rows.append({"attention": attention, "error": done.stderr[-2000:]})
            print(f"  {attention:<12} failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        peak = fmt(None if row["peak_bytes"] is None else row["peak_bytes"] / 2**20, ",.0f")
        print(
            f"  {attention:<12} peak above weights and gradients {peak} MiB, saved for backward"
            f" {row['saved_bytes'] / 2**20:,.0f} MiB, {row['ms']:.1f} ms per forward + backward",
            flush=True,
        )
    return rows


# Dense bf16 TFLOP/s of one GPU from the data sheets (the generated project's metrics.py has the same).
DATASHEET = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0)]


def datasheet_peak(device: str) -> float | None:
    if device != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name()
    return next((peak for known, peak in DATASHEET if known in name), None)


def choose_contenders(given: str | None, env: dict[str, str]) -> list[str]:
    if given:
        return given.split(",")
    contenders = ["reference", "generated", "generated-quiet"]
    if trainer_has_compile(env):
        contenders.append("generated-compile")
    for name in OPTIONAL:
        if installed(name):
            contenders.append(name)
        else:
            print(f"note: {name} is not installed; skipped", flush=True)
    return contenders


def describe(w: Workload) -> str:
    if w.task == "lm":
        return (
            f"GPT {w.n_layer} blocks x {w.d_model} wide, {w.n_head} heads, context {w.seq_len}"
            f" ({w.params() / 1e6:.1f} M parameters), batch {w.batch_size} x {w.grad_accum_steps}"
            f" micro-steps of {w.seq_len} tokens, {w.precision}"
        )
    return (
        f"MLP {w.input_dim}-{w.hidden_dim}x{w.depth}-{w.num_classes} ({w.params() / 1e6:.1f} M"
        f" parameters), batch {w.batch_size} x {w.grad_accum_steps} micro-steps, {w.precision}"
    )


def report(
    name: str,
    w: Workload,
    runs: list[dict],
    contenders: list[str],
    peak: float | None,
    repeats: int,
    datasheet: float | None = None,
) -> dict[str, Any]:
    """Print the workload's table and targets; return its rows for the JSON."""
    summary = summarize(runs, contenders, [1])["1"]
    print(f"\n{name}: W=1, medians of {repeats} interleaved rounds")
    lm = w.task == "lm"
    rate_name = "tokens/s" if lm else "samples/s"
    header = f"{'contender':<20}{rate_name:>12}{'TFLOP/s':>10}{'x matmul':>10}{'MFU':>7}{'x ref':>8}"
    print(header + f"{'data wait':>11}")
    rows = {}
    for c in contenders:
        row = summary["contenders"][c]
        rate = row["median_samples_per_sec"]
        tflops = w.flops_per_sample() * rate / 1e12 if rate else None
        of_peak = tflops / peak if tflops and peak else None
        mfu = tflops / datasheet if tflops and datasheet else None
        shown = rate * w.seq_len if rate and lm else rate
        key = "self_data_wait_frac_median"
        waits = [r[key] for r in runs if r["contender"] == c and key in r]
        wait = sorted(waits)[len(waits) // 2] if waits else None
        rows[c] = {**row, "tflops": tflops, "fraction_of_matmul": of_peak, "data_wait_frac": wait, "mfu": mfu}
        if lm:
            rows[c]["median_tokens_per_sec"] = shown
            selfs = [r["self_mfu_median"] for r in runs if r["contender"] == c and "self_mfu_median" in r]
            rows[c]["self_reported_mfu"] = sorted(selfs)[len(selfs) // 2] if selfs else None
        ratio = row["median_ratio_to_reference"]
        wait_text = fmt(None if wait is None else 100 * wait, ".1f") + "%"
        mfu_text = fmt(None if mfu is None else 100 * mfu, ".1f") + "%"
        print(
            f"{c:<20}{fmt(shown, ',.0f'):>12}{fmt(tflops, '.1f'):>10}{fmt(of_peak, '.2f'):>10}"
            f"{mfu_text:>7}{fmt(ratio, '.3f'):>8}{wait_text:>11}"
        )
    for c, target in TARGETS.items():
        ratio = rows.get(c, {}).get("median_ratio_to_reference")
        if ratio is not None:
            print(f"target {c} >= {target:.2f}x reference: {ratio:.3f} {verdict(ratio >= target)}")
    parts = [summary.get(f"inrun_overhead_pct_{group}") for group in ("log_ckpt", "eval")]
    if None not in parts:
        print(f"logging + evaluation + checkpointing in the generated run: {sum(parts):.1f}% of step time")
    mfu = rows.get("generated-compile", rows.get("generated", {})).get("mfu")
    if lm and mfu is not None:
        which = "generated-compile" if "generated-compile" in rows else "generated"
        print(f"target {which} MFU >= {MFU_TARGET:.0%}: {mfu:.1%} {verdict(mfu >= MFU_TARGET)}")
    frac = rows.get("generated", {}).get("fraction_of_matmul")
    if name == "compute" and frac is not None:
        ok = verdict(frac >= MATMUL_TARGET)
        print(f"target generated >= {MATMUL_TARGET} of the matmul rate: {frac:.2f} {ok}")
    for r in runs:
        if "error" in r:
            print(f"note: round {r['round'] + 1} {r['contender']}: {r['error']}")
    return {"workload": {**asdict(w), "params": w.params()}, "rows": rows, "summary": summary, "runs": runs}


def verdict(ok: bool) -> str:
    return "[ok]" if ok else "[MISSED]"


if __name__ == "__main__":
    sys.exit(main())
