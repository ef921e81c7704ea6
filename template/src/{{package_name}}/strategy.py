"""How the model is spread over the ranks: DDP (a full replica per rank) or FSDP2 (shards).

--strategy ddp: every rank holds the whole model, optimizer state and gradients; one all-reduce
per optimizer step averages the gradients. --comm-hook compresses that all-reduce:
- bf16 / fp16: gradients travel as 16-bit floats (half the bytes), averaged in 16 bits and cast
  back. Each bucket's average is rounded to 8 (bf16) or 11 (fp16) significant bits; fp16 can
  also overflow above 65504 or flush tiny gradients to zero, bf16 cannot (fp32's exponent).
- powersgd: each gradient matrix is sent as a rank-r product P Q^T (PowerSGD, Vogels et al.
  2019): far fewer bytes, but lossy. Error feedback adds what compression dropped to the next
  step's gradient, so nothing is lost for good, only delayed. Its state (the errors, Q, the
  iteration) lives across steps and goes into every checkpoint.

--strategy fsdp: fully_shard (FSDP2) splits every parameter, its gradient and its optimizer
state across the ranks, each rank keeping 1/world-size of them. A block all-gathers its
parameters just before its forward (and again before its backward) and frees them after; the
gradients are reduce-scattered, so each rank averages only its own shard. It costs about 1.5x
DDP's communication and saves memory: use it when the model and AdamW state do not fit one GPU.
Checkpoints are sharded too (sharded.py). Everything else in train.py is the same.
"""

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from . import dist
from .config import TrainConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# PowerSGD: rank 2 keeps most of the gradient's energy for MLP-sized layers at a fraction of
# the bytes. Its first steps are plain all-reduces (also while DDP settles its buckets after
# step 1): with a warming-up LR, compressing the first large, fast-changing gradients costs the
# most accuracy (Vogels et al.).
POWERSGD_RANK = 2
POWERSGD_START = 10


def wrap(
    model: nn.Module, cfg: TrainConfig, device: torch.device, example: torch.Tensor
) -> nn.Module:
    """The model ready for data-parallel training, per --strategy and --comm-hook.

    `example` is one input sample (without the batch dimension).
    """
    if cfg.strategy == "fsdp":
        return shard(model, cfg.precision)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.comm_hook == "powersgd":
        settle_buckets(ddp, example.to(device))
    register_comm_hook(ddp, cfg.comm_hook, device)
    return ddp


def settle_buckets(model: DDP, example: torch.Tensor) -> None:
    """Let DDP rebuild its gradient buckets now, before any real step.

    DDP's first backward fills its buckets in parameter order, then it rebuilds them in the
    order gradients became ready (about the reverse). PowerSGD keeps its error feedback and Q
    per bucket, as flat tensors: a resumed process, in its first step, would apply them to a
    bucket laid out the other way. One backward of an empty batch (all-zero gradients, thrown
    away) makes every process, fresh or resumed, train with the rebuilt buckets from step 1.
    """
    model(example[None][:0]).sum().backward()
    model.zero_grad(set_to_none=True)


def shard(model: nn.Module, precision: str) -> nn.Module:
    """FSDP2: shard each block, then the root (which takes the parameters no block holds).

    Each block is the unit of communication and of memory: its parameters are all-gathered
    together, used, and freed, so at most about one block is whole at a time. Wrapping every
    layer would mean many small all-gathers; wrapping only the root, a whole model at once.
    """
    # Parameters are all-gathered (and the forward runs) in --precision; gradients are
    # reduce-scattered and the optimizer updates the shards in fp32, whatever --precision.
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)
    for block in blocks(model):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules to shard one by one: the model's layers that hold parameters.

    A transformer's blocks (`model.blocks`), one unit each; otherwise its Linear layers (the
    MLP). For your own model, return its blocks (say `model.layers`): a block should be big
    enough that its all-gather is worth launching. Parameters shared between two modules (an
    output layer tied to the embedding) must stay in one unit: here, the root's.
    """
    if isinstance(getattr(model, "blocks", None), nn.ModuleList):
        return list(model.blocks)
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def register_comm_hook(model: DDP, hook: str, device: torch.device) -> None:
    """Compress DDP's gradient all-reduce per --comm-hook (none: the plain fp32 all-reduce)."""
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        model.register_comm_hook(None, bf16_hook(device))
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=POWERSGD_START,
            random_seed=0,  # the same Q on every rank, and in every run
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        model.powersgd_state = state  # saved in checkpoints: see comm_hook_state


def bf16_hook(device: torch.device) -> Any:
    """torch's bf16 compression hook, also on CPU.

    DDP accepts torch's bf16_compress_hook only with NCCL 2.10+ (older NCCL had no bf16), and
    refuses it by its name with gloo, although gloo all-reduces bf16 (torch 2.13). On CPU, the
    same function under another name passes that check and does the same arithmetic.
    """
    if device.type == "cuda":
        return default_hooks.bf16_compress_hook

    def bf16_compress(
        process_group: torch_dist.ProcessGroup, bucket: torch_dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        return default_hooks.bf16_compress_hook(process_group, bucket)

    return bf16_compress


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module: DDP's `.module`; FSDP2 changes the module in place, so itself."""
    return model.module if isinstance(model, DDP) else model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def no_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """Skip the gradient reduction of a micro-step that is not the last of its window.

    DDP: no_sync() must wrap the forward too, as DDP decides during forward whether to sync.
    FSDP2: the flag is read in backward; the parameters also stay whole until the window's
    last backward (no reshard), trading memory for not all-gathering them again each micro-step.
    """
    model = getattr(model, "_orig_mod", model)  # --compile: the module torch.compile wraps
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
        model.set_reshard_after_backward(sync)
        return nullcontext()
    return nullcontext() if sync else model.no_sync()


def join_forwards(model: nn.Module, loader: DataLoader, device: torch.device) -> None:
    """FSDP: run empty forwards so that this rank runs as many as the rank with most batches.

    Each FSDP forward all-gathers parameters with every rank, so all ranks must run the same
    number of them; the evaluation shards are unpadded (exact metrics), and may differ by one
    batch. The empty forwards run first and add nothing to the metrics. DDP: nothing to do.
    """
    if not is_sharded(model):
        return
    most = dist.max_(torch.tensor(len(loader), device=device)).item()
    sample, _ = loader.dataset.dataset[0]  # data.build_eval_loader: a Subset of the val set
    for _ in range(most - len(loader)):
        model(sample.to(device)[None][:0])  # a batch of 0 samples


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor as a regular tensor (FSDP's gradient norm is a replicated DTensor)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def comm_hook_state(model: nn.Module) -> dict[str, Any] | None:
    """This rank's PowerSGD state as plain types (per rank: error feedback is local); or None."""
    state = _powersgd_state(model)
    if state is None:
        return None
    name, keys, pos, has_gauss, cached = state.rng.get_state()
    return {
        "iter": state.iter,
        "error_dict": dict(state.error_dict),  # bucket index -> what compression dropped
        "p_memory_dict": dict(state.p_memory_dict),
        "q_memory_dict": dict(state.q_memory_dict),  # warm start: last step's Q per bucket
        # numpy's generator, which seeds each new bucket's first Q: plain types only.
        "rng": [name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached],
    }


def set_comm_hook_state(model: nn.Module, saved: dict[str, Any] | None) -> None:
    """Restore comm_hook_state() into the hook that wrap() registered (same --comm-hook)."""
    state = _powersgd_state(model)
    if state is None or saved is None:
        return
    state.iter = saved["iter"]
    state.error_dict = dict(saved["error_dict"])
    state.p_memory_dict = dict(saved["p_memory_dict"])
    state.q_memory_dict = dict(saved["q_memory_dict"])
    name, keys, pos, has_gauss, cached = saved["rng"]
    state.rng.set_state((name, keys.cpu().numpy().astype("uint32"), pos, has_gauss, cached))


def _powersgd_state(model: nn.Module) -> powerSGD_hook.PowerSGDState | None:
    """The PowerSGD state that register_comm_hook kept on the DDP model, if any."""
    return getattr(model, "powersgd_state", None)
