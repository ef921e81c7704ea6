"""The lm model's step with dropout: keyed masks and written-out attention vs SDPA(dropout_p).

    python -m bench.dropout                      # 4 blocks x 128, context 64, batch 8 and 12
    python -m bench.dropout --batch-sizes 12 --rounds 21

One process, one thread, no DDP: a micro-batch's forward + backward of the rendered lm
project's GPT with --dropout 0.1, as the generated trainer runs it (every nn.Dropout keyed by
keyed.convert_dropout, each micro-batch inside keyed.batch, the attention weights' dropout
written out) and as bench/lm_loop.py's reference-same-work runs it (torch's nn.Dropout, the
attention inside F.scaled_dot_product_attention(dropout_p=0.1)), and without dropout (SDPA).
The variants alternate within each round and are timed in CPU seconds of this process, so
other processes taking turns on the cores cost them alike: this resolves a few percent on a
shared machine, where separate `python -m bench --workload lm` runs differ by 5-15 %.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .harness import PACKAGE, run_worker, save_results, stamp

VARIANTS = ("generated", "sdpa", "no-dropout")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the project's environment: the rounds, per batch size."""
    import torch
    import torch.nn.functional as F

    from .lm_loop import sdpa_attention

    torch.set_num_threads(1)
    keyed = importlib.import_module(f"{PACKAGE}.engine.keyed")
    gpt = importlib.import_module(f"{PACKAGE}.model").GPT

    def model(variant: str) -> torch.nn.Module:
        torch.manual_seed(0)
        dropout = 0.0 if variant == "no-dropout" else args.dropout
        net = gpt(args.n_layer, args.n_head, args.d_model, args.seq_len, 256, dropout=dropout).train()
        if variant == "generated":
            return keyed.convert_dropout(net)
        for module in net.modules():
            if type(module).__name__ == "CausalSelfAttention":
                module.forward = sdpa_attention.__get__(module)
        return net

    models = {v: model(v) for v in VARIANTS}
    out: dict[str, Any] = {}
    for batch in args.batch_sizes:
        tokens = torch.randint(0, 256, (batch, args.seq_len), generator=torch.Generator().manual_seed(1))

        def step(variant: str, tokens: torch.Tensor = tokens) -> None:
            net = models[variant]
            with keyed.batch(net, 0, 1, range(len(tokens)), torch.device("cpu")):
                loss = F.cross_entropy(net(tokens).flatten(0, -2), tokens.flatten())
                loss.backward()

        ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for v in VARIANTS:  # warm-up
            step(v)
        for _ in range(args.rounds):
            for v in VARIANTS:
                started = time.process_time()
                for _ in range(args.steps):
                    step(v)
                ms[v].append(1000 * (time.process_time() - started) / args.steps)
        ratios = [g / s for g, s in zip(ms["generated"], ms["sdpa"], strict=True)]
        out[str(batch)] = {
            "ms": ms,
            "median_ms": {v: statistics.median(x) for v, x in ms.items()},
            "ratios_generated_to_sdpa": ratios,
            "median_ratio": statistics.median(ratios),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dropout", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 12])
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--steps", type=int, default=10, help="forward + backward passes per timing")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    results = run_worker("bench.dropout", argv if argv is not None else sys.argv[1:], data={"task": "lm"})
    if results is None:
        return 1
    shape = f"GPT {args.n_layer} x {args.d_model}, {args.n_head} heads, context {args.seq_len}"
    shape += f", dropout {args.dropout}"
    print(f"{shape}; one micro-batch's forward + backward, ms of CPU time, median of {args.rounds} rounds:")
    for batch, r in results.items():
        med = r["median_ms"]
        print(
            f"  batch {batch}: generated (keyed, written out) {med['generated']:.1f}, SDPA(dropout_p)"
            f" {med['sdpa']:.1f}, no dropout {med['no-dropout']:.1f};"
            f" generated / SDPA {r['median_ratio']:.3f} (rounds: "
            + ", ".join(f"{x:.3f}" for x in r["ratios_generated_to_sdpa"])
            + ")"
        )
    path = save_results(
        "dropout",
        {
            **stamp("python -m bench.dropout", argv),
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "results": results,
        },
        args.json,
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
