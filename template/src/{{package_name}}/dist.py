"""Process-group setup and teardown, and the collectives training needs.

torchrun starts one process per GPU and tells each one who it is through environment
variables: RANK (index among all processes), LOCAL_RANK (index on this node, which is the
GPU to use), WORLD_SIZE, and MASTER_ADDR/MASTER_PORT (where the rendezvous store lives).
Without torchrun the script runs as one process with world size 1 and takes exactly the same
code path: a real process group, the DDP wrapper, the same collectives.

Debugging a hang: run with TORCH_DISTRIBUTED_DEBUG=DETAIL (checks that ranks call the same
collectives), and on GPUs add TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
to dump the NCCL flight recorder when --dist-timeout expires.
"""

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as torch_dist

from .config import ConfigError

if TYPE_CHECKING:
    from .preemption import Preemption


@dataclass(frozen=True)
class DistEnv:
    rank: int  # index of this process among all processes
    local_rank: int  # index on this node: the GPU this process drives
    world_size: int  # number of processes


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
TORCHRUN_VARIABLES = (*RANK_VARIABLES, "MASTER_ADDR", "MASTER_PORT")


def read_env() -> DistEnv:
    """Who this process is, from torchrun's variables (one process when they are absent).

    Some of them without the others (a WORLD_SIZE left in the shell, say) would make this
    process wait --dist-timeout for ranks that never come, or fail deep inside torch: refuse.
    """
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
    # The LOCAL rank: the global rank names a GPU that does not exist on every node but the first.
    return torch.device("cuda", local_rank)


def check_precision(precision: str, device: torch.device) -> None:
    """bf16 needs Ampere (compute capability 8.0) or newer; older GPUs would emulate it slowly."""
    if precision == "bf16" and device.type == "cuda":
        if torch.cuda.get_device_capability(device) < (8, 0):
            raise ConfigError(
                "--precision bf16 needs a GPU with bf16 support (Ampere or newer);"
                " use --precision fp16 or fp32"
            )


_HOST_GROUP: torch_dist.ProcessGroup | None = None  # see host_group()


def setup(env: DistEnv, device: torch.device, timeout_s: int) -> None:
    """Create the process group: nccl for GPUs, gloo for CPUs."""
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init, so NCCL and barriers use this GPU
    torch_dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        store=_store(env, timeout),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        # Binds the group to this GPU: NCCL connects eagerly and barriers need not guess a device.
        device_id=device if device.type == "cuda" else None,
    )
    global _HOST_GROUP
    # Every rank creates it, in the same order: new_group is a collective.
    _HOST_GROUP = torch_dist.new_group(backend="gloo") if device.type == "cuda" else None


def _store(env: DistEnv, timeout: timedelta) -> torch_dist.Store | None:
    """The key-value store the ranks meet in; None means torch's default (env://)."""
    if "RANK" not in os.environ:
        return torch_dist.HashStore()  # one process: nobody to meet, an in-memory store will do
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun keeps its store across worker restarts, with the keys the dead workers wrote;
        # a restarted rank can read a dead peer's address and hang (pytorch/pytorch#135712).
        # A key prefix per restart attempt gives every attempt a clean store.
        store = torch_dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            env.world_size,
            is_master=False,
            timeout=timeout,
        )
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return torch_dist.PrefixStore(f"attempt_{attempt}", store)
    return None


USAGE_ERROR_GRACE_S = 5.0  # see report_usage_error


def report_usage_error(message: str, env: DistEnv, preemption: "Preemption") -> None:
    """Print a mistake in the settings once, not once per rank.

    Every rank checks the same settings, so rank 0 reports and the others stay silent: once
    rank 0 has exited, torchrun stops them with SIGTERM. A rank that gets no SIGTERM within a
    few seconds found a mistake of its own (a GPU that does not exist on its node, say), which
    rank 0 cannot report, and reports it itself.
    """
    if env.rank != 0:
        deadline = time.monotonic() + USAGE_ERROR_GRACE_S
        while not preemption.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        if preemption.requested:
            return
        message = f"rank {env.rank}: {message}"
    print(f"error: {message}", file=sys.stderr, flush=True)


def cleanup(clean_exit: bool) -> None:
    """Destroy the process group: at the end, or after an error in a one-process run."""
    if not torch_dist.is_initialized():
        return
    if clean_exit:
        # gloo worker threads release a finished collective a moment after wait() returns, and
        # releasing tensors made in Python needs the GIL; destroying the group meanwhile can
        # abort (SIGABRT) or hang at exit. Draining with barriers (whose tensors live in C++)
        # makes the last collective a harmless one. Skipped after an error: peers may be gone.
        for _ in range(2):
            time.sleep(0.05)
            torch_dist.barrier()
        time.sleep(0.05)
    torch_dist.destroy_process_group()  # the host group too
    global _HOST_GROUP
    _HOST_GROUP = None


def fail(err: BaseException, env: DistEnv, timeout_s: int) -> NoReturn:
    """An exception escaped training: re-raise it with one process; with several, exit at once.

    With several ranks the peers may be gone, and tearing down while gloo threads still hold a
    failed collective can abort (SIGABRT) or hang the process, replacing the real error and its
    exit status. So print the traceback and exit 1 without teardown: the OS closes this rank's
    connections, and torchrun stops the other ranks (or restarts them all, --max-restarts).
    """
    if env.world_size == 1:
        cleanup(clean_exit=False)
        raise err
    sys.excepthook(type(err), err, err.__traceback__)  # torch's hook adds a [rankN] prefix
    text = str(err)
    if isinstance(err, torch_dist.DistError) or "gloo" in text or "NCCL" in text:
        print(
            f"error: rank {env.rank}: a collective failed: another rank crashed, was killed, or"
            f" stalled for longer than --dist-timeout ({timeout_s} s). Look for its own error in"
            " this output; if there is none, it was killed or stalled (py-spy dump shows where)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def rank() -> int:
    """This process's global rank: the group's, or torchrun's RANK before the group exists."""
    if torch_dist.is_initialized():
        return torch_dist.get_rank()
    return int(os.environ.get("RANK", 0))


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


def barrier() -> None:
    torch_dist.barrier()


def sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks, in place."""
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def max_(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over all ranks, in place."""
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
    return tensor


def min_(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise minimum over all ranks, in place."""
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MIN)
    return tensor


class AgreeLater:
    """Named host-side flags of all ranks (their maximum), agreed in the background.

    Why it exists: every rank must stop (SIGTERM, Ctrl-C) or checkpoint (--ckpt-every-minutes)
    at the same step, or one of them would wait forever in a collective the others never join.
    A blocking all-reduce every step would make the ranks wait for each other a second time
    per step; on a GPU, reading a flag back from the device would also wait for the whole
    queue of kernels. So the flags stay on the host (CPU tensors, over gloo: `host_group()`),
    start() launches the all-reduce at the end of step N and result() collects it at the end
    of step N+1, by when it has long finished. Every rank calls both at the same steps, so all
    of them get the same answer at the same step, one step late.
    """

    def __init__(self, *names: str) -> None:
        self.names = names
        self._pending: tuple[torch_dist.Work, torch.Tensor] | None = None

    def start(self, **flags: int) -> None:
        """Start agreeing on this rank's flags: small non-negative ints, one per name."""
        values = torch.tensor([flags[name] for name in self.names], dtype=torch.int64)
        work = torch_dist.all_reduce(
            values, op=torch_dist.ReduceOp.MAX, group=host_group(), async_op=True
        )
        self._pending = (work, values)

    def result(self) -> dict[str, int]:
        """Each flag of the last start(), its maximum over all ranks (all 0 before any)."""
        if self._pending is None:
            return dict.fromkeys(self.names, 0)
        work, values = self._pending
        self._pending = None
        work.wait()
        return dict(zip(self.names, values.tolist(), strict=True))  # a CPU tensor: no sync


def host_group() -> torch_dist.ProcessGroup | None:
    """A gloo group for small host-side agreements; None (the default group) when it is gloo.

    On GPUs the default group is nccl, whose collectives run on the device: a flag sent
    through it would have to be copied to the GPU and its answer read back (a sync).
    """
    return _HOST_GROUP


def all_gather_object(obj: Any) -> list[Any]:
    """Collect one picklable object from every rank, in rank order, on every rank.

    Over the host group: with nccl the pickled bytes would travel through the GPUs.
    """
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
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    digests = all_gather_object(digest)
    if len(set(digests)) > 1:
        raise RuntimeError(f"ranks disagree on {description}: digests by rank {digests}")


def param_fingerprint(model: torch.nn.Module) -> int:
    """An integer that changes when any bit of any parameter changes, to compare replicas."""
    total = torch.zeros((), dtype=torch.int64)
    int_types = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for p in model.parameters():
        bits = p.detach().reshape(-1).view(int_types[p.element_size()]).to(torch.int64)
        position = torch.arange(1, bits.numel() + 1, device=bits.device) % 65521
        # int64 arithmetic wraps around on overflow, which is fine for a checksum.
        total = total * 1_000_003 + (bits * position).sum().cpu()
    return int(total)


def check_replicas(model: torch.nn.Module) -> list[int]:
    """Every rank's parameter fingerprint; DDP must keep the replicas bitwise identical."""
    fingerprints = all_gather_object(param_fingerprint(model))
    if len(set(fingerprints)) > 1:
        raise RuntimeError(f"replicas diverged: parameter fingerprints by rank {fingerprints}")
    return fingerprints
