"""The process group: who this process is (torchrun's variables), setup and teardown, and the
collectives training needs. Without torchrun a run is one process with world size 1, on the
same code path (a real process group, the same collectives). Hangs: docs/troubleshooting.md.
"""

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as torch_dist

from . import rendezvous
from .options import ConfigError


@dataclass(frozen=True)
class DistEnv:
    rank: int  # index of this process among all processes
    local_rank: int  # index on this node: the GPU this process drives
    world_size: int  # number of processes


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
TORCHRUN_VARIABLES = (*RANK_VARIABLES, "MASTER_ADDR", "MASTER_PORT")


def read_env() -> DistEnv:
    """Who this process is, from torchrun's variables (one process when they are absent).
    Some of them without the others (a WORLD_SIZE left in the shell) would make this process
    wait --dist-timeout for ranks that never come, or fail deep inside torch: refused."""
    given = [name for name in RANK_VARIABLES if name in os.environ]
    if not given:
        return DistEnv(rank=0, local_rank=0, world_size=1)
    missing = [name for name in TORCHRUN_VARIABLES if not os.environ.get(name)]
    fix = "launch with torchrun, or unset RANK, LOCAL_RANK and WORLD_SIZE to run one process"
    if missing:
        verb = "is" if len(given) == 1 else "are"
        raise ConfigError(
            f"{' and '.join(given)} {verb} set but not {', '.join(missing)} (torchrun sets them"
            f" all): {fix}"
        )
    values = {}
    for name in (*RANK_VARIABLES, "MASTER_PORT"):
        text = os.environ[name]
        if not (text.isascii() and text.isdigit()):  # int() would take "٣" or " 3", torch not
            raise ConfigError(f"{name}={text!r} is not a non-negative integer: {fix}")
        values[name] = int(text)
    env = DistEnv(values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"])
    if not (0 <= env.rank < env.world_size and 0 <= env.local_rank < env.world_size):
        raise ConfigError(
            f"RANK={env.rank}, LOCAL_RANK={env.local_rank}, WORLD_SIZE={env.world_size} do not"
            f" fit together (0 <= RANK, LOCAL_RANK < WORLD_SIZE): {fix}"
        )
    if not 0 < values["MASTER_PORT"] < 65536:
        raise ConfigError(f"MASTER_PORT={values['MASTER_PORT']} is not a TCP port: {fix}")
    return env


def pick_device(name: str, local_rank: int) -> torch.device:
    """The device of this process for --device auto|cpu|cuda."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available here; use --device cpu or auto")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"--device cuda: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs"
            " are visible; start at most that many processes per node (--nproc_per_node)"
        )
    return torch.device("cuda", local_rank)  # the local rank: a GPU on this node


def check_precision(precision: str, device: torch.device) -> None:
    """bf16 needs Ampere (compute capability 8.0) or newer; older GPUs would emulate it slowly."""
    if precision == "bf16" and device.type == "cuda":
        if torch.cuda.get_device_capability(device) < (8, 0):
            raise ConfigError(
                "--precision bf16 needs a GPU with bf16 support (Ampere or newer);"
                " use --precision fp16 or fp32"
            )


_HOST_GROUP: torch_dist.ProcessGroup | None = None  # gloo beside nccl: see host_group()


def setup(env: DistEnv, device: torch.device, timeout_s: int) -> None:
    """Create the process group: nccl for GPUs, gloo for CPUs. ConfigError (one line) if the
    ranks cannot meet at MASTER_ADDR:MASTER_PORT (rendezvous.py)."""
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init, so NCCL and barriers use this GPU
    with rendezvous.one_line_failures(env.world_size, timeout_s):
        torch_dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            store=rendezvous.store(env.world_size, timeout),
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,  # NCCL connects eagerly
        )
    global _HOST_GROUP  # new_group is a collective: every rank creates it, in the same order
    _HOST_GROUP = torch_dist.new_group(backend="gloo") if device.type == "cuda" else None


def cleanup(clean_exit: bool) -> None:
    """Destroy the process group: at the end, or after an error in a one-process run."""
    if not torch_dist.is_initialized():
        return
    if clean_exit:  # not after an error: the peers may be gone
        # gloo threads free a finished collective's Python tensors a moment after wait(); a
        # teardown meanwhile can abort or hang. Barriers' tensors live in C++: end with them.
        for _ in range(2):
            time.sleep(0.05)
            torch_dist.barrier()
        time.sleep(0.05)
    torch_dist.destroy_process_group()  # the host group too
    global _HOST_GROUP
    _HOST_GROUP = None


def rank() -> int:
    """This process's global rank: the group's, or torchrun's RANK before the group exists."""
    return torch_dist.get_rank() if torch_dist.is_initialized() else int(os.environ.get("RANK", 0))


def is_main() -> bool:
    """True on global rank 0, the only process that prints, logs and writes files."""
    return rank() == 0


def world_size() -> int:
    """Number of processes in the group (1 before it exists)."""
    return torch_dist.get_world_size() if torch_dist.is_initialized() else 1


def print0(message: str) -> None:
    """Print on rank 0 only."""
    if is_main():
        print(message, flush=True)


def print0_error(message: str) -> None:
    """'error: message' on stderr, on rank 0 only."""
    if is_main():
        print(f"error: {message}", file=sys.stderr, flush=True)


def _all_reduce(tensor: torch.Tensor, op: torch_dist.ReduceOp) -> torch.Tensor:
    torch_dist.all_reduce(tensor, op=op)
    return tensor


# Element-wise over all ranks, in place (the tensor is returned too); barrier: all ranks meet.
sum_ = partial(_all_reduce, op=torch_dist.ReduceOp.SUM)
max_ = partial(_all_reduce, op=torch_dist.ReduceOp.MAX)
min_ = partial(_all_reduce, op=torch_dist.ReduceOp.MIN)
barrier = torch_dist.barrier


class AgreeLater:
    """Named host-side flags of all ranks (their maximum), agreed in the background: all ranks
    must stop (SIGTERM, Ctrl-C) or save (--ckpt-every-minutes) at the same step. A blocking
    all-reduce (or a read from the GPU) would stall every step, so start() launches one over
    gloo at the end of step N and result() collects it at the end of step N+1."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self._pending: tuple[torch_dist.Work | None, torch.Tensor] | None = None

    def start(self, **flags: int) -> None:
        """Start agreeing on this rank's flags: small non-negative ints, one per name. One
        process has nobody to agree with: its flags are the result, without a collective."""
        values = torch.tensor([flags[name] for name in self.names], dtype=torch.int64)
        op, work = torch_dist.ReduceOp.MAX, None
        if world_size() > 1:
            work = torch_dist.all_reduce(values, op, host_group(), async_op=True)
        self._pending = (work, values)

    def result(self) -> dict[str, int]:
        """Each flag of the last start(), its maximum over all ranks (all 0 before any)."""
        if self._pending is None:
            return dict.fromkeys(self.names, 0)
        work, values = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        return dict(zip(self.names, values.tolist(), strict=True))  # a CPU tensor: no sync


def host_group() -> torch_dist.ProcessGroup | None:
    """A gloo group for small host-side agreements; None (the default group) when it is gloo.
    nccl runs on the device: a flag sent through it would be copied there and read back."""
    return _HOST_GROUP


def all_gather_object(obj: Any) -> list[Any]:
    """Collect one picklable object from every rank, in rank order, on every rank (over the
    host group: with nccl the pickled bytes would travel through the GPUs)."""
    gathered: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, obj, group=host_group())
    return gathered


def from_main(obj: Any) -> Any:
    """Rank 0's `obj` (picklable), on every rank: what rank 0 alone knows, such as how its
    writes went. A collective, over the host group."""
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0, group=host_group())
    return box[0]


def check_same_on_all_ranks(description: str, value: str) -> None:
    """Fail fast, instead of hanging later, when ranks disagree (e.g. on config or data)."""
    digests = all_gather_object(hashlib.sha256(value.encode()).hexdigest()[:12])
    if len(set(digests)) > 1:
        raise RuntimeError(f"ranks disagree on {description}: digests by rank {digests}")


def check_replicas(model: torch.nn.Module) -> list[int]:
    """Every rank's parameter fingerprint (a checksum of every bit of every parameter); DDP
    must keep the replicas bitwise identical."""
    total = torch.zeros((), dtype=torch.int64)
    int_types = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for p in model.parameters():
        bits = p.detach().reshape(-1).view(int_types[p.element_size()]).to(torch.int64)
        position = torch.arange(1, bits.numel() + 1, device=bits.device) % 65521
        total = total * 1_000_003 + (bits * position).sum().cpu()  # int64 wraps around: fine
    fingerprints = all_gather_object(int(total))
    if len(set(fingerprints)) > 1:
        raise RuntimeError(f"replicas diverged: parameter fingerprints by rank {fingerprints}")
    return fingerprints
