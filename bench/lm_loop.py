"""The hand-written contender for the language-model workload: a plain DDP loop on the same GPT.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m bench.lm_loop \
        --contender reference --data-path text.txt --max-steps 111 --warmup 10 --timed 100

The model is the rendered project's own GPT class (imported from it, so both contenders train
exactly the same network; what is compared is the loop around it). The data is the same text,
cut the way the generated trainer cuts it (the first 90 % for training, non-overlapping windows
of --seq-len + 1 bytes), but held in memory as one tensor: the fastest possible data path.

- reference-same-work: what the generated trainer does at its defaults (bench.loops: fused
             AdamW with decay on matrices only, clipping at 1.0, warmup + cosine LR, no update
             on a non-finite gradient norm). With --dropout, attention drops its weights
             inside F.scaled_dot_product_attention(dropout_p=...) and the other dropouts are
             torch's: torch's own masks, where the trainer's are keyed (its keyed.py).
- reference: DistributedSampler + DDP + `no_sync()` on all micro-steps but the last, loss / A,
             fused AdamW (as the generated trainer uses); no clipping, schedule, logging,
             evaluation or checkpoints. With --dropout, the project's attention as it is (the
             weights' dropout written out) with torch's masks.
- allreduce: the reference without no_sync (an all-reduce after every micro-step).

The loop is bench.loops.run_ddp's; this module supplies the windows and the GPT. Prints one
result line (bench.timing) on rank 0.
"""

from __future__ import annotations

import argparse
import importlib
import types

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from .loops import add_loop_flags, parse_args, run_ddp


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contender", required=True, choices=["reference-same-work", "reference", "allreduce"])
    p.add_argument("--package", default="benchproj", help="the rendered project's package (its GPT)")
    p.add_argument("--data-path", required=True, help="UTF-8 text to train on")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0, help="as the trainer's --dropout")
    p.add_argument("--batch-size", type=int, default=8, help="windows per rank per micro-step")
    return add_loop_flags(p)


def make_dataset(path: str, seq_len: int) -> TensorDataset:
    """Training windows of a text's bytes: inputs and the same shifted by one."""
    tokens = torch.from_numpy(np.fromfile(path, dtype=np.uint8).astype(np.int64))
    train = tokens[: int(len(tokens) * 0.9)]
    windows = (len(train) - 1) // seq_len
    index = torch.arange(windows)[:, None] * seq_len + torch.arange(seq_len + 1)
    chunks = train[index]
    return TensorDataset(chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous())


def build_gpt(args: argparse.Namespace, device: torch.device) -> tuple[TensorDataset, nn.Module]:
    """The windows of --data-path and the project's GPT (a bench.loops.Build)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32, as the generated trainer sets it
    gpt = importlib.import_module(f"{args.package}.model").GPT
    model = gpt(args.n_layer, args.n_head, args.d_model, args.seq_len, vocab_size=256, dropout=args.dropout)
    if args.contender == "reference-same-work":
        for module in model.modules():
            if type(module).__name__ == "CausalSelfAttention":
                module.forward = types.MethodType(sdpa_attention, module)
    return make_dataset(args.data_path, args.seq_len), model


def sdpa_attention(self: nn.Module, x: Tensor) -> Tensor:
    """The project's CausalSelfAttention.forward with the dropout of the attention weights done
    by F.scaled_dot_product_attention(dropout_p=...) (torch's masks) instead of written out."""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=2)
    if self.qv_bias is not None:
        q_bias, v_bias = self.qv_bias.split(C)
        q, v = q + q_bias, v + v_bias
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    p = self.weights_drop.p if self.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
    return self.proj_drop(self.proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def main(argv: list[str] | None = None) -> None:
    run_ddp(parse_args(build_parser(), argv), build_gpt, fused=True)


if __name__ == "__main__":
    main()
