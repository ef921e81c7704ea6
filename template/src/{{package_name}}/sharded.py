"""Sharded checkpoints of --strategy fsdp, with torch.distributed.checkpoint (DCP).

Under FSDP no rank holds the whole model, so every rank writes its own shards of the model and
optimizer state, in parallel, into a directory next to the usual file:

    checkpoints/step_00000300.dcp/   model and optimizer shards (one file per rank + .metadata)
    checkpoints/step_00000300.pt     everything else (step, data position, RNG, config, ...)

The .pt file is written last (checkpoint.py, atomically), and a checkpoint is the .pt file: a
save that stopped half-way leaves at most a directory without its .pt, which --resume auto
never sees and the next save removes. The directory itself is written as `step_N.dcp.tmp` and
renamed once every rank has finished. Before a directory is read, verify() checks that every
shard file its metadata names is there, whole: a deleted or truncated one would otherwise crash
every rank in the middle of loading, where --resume auto could no longer fall back to an older
checkpoint. DCP stores each tensor with its global shape, so a run
on another number of ranks reads back the slices it needs (resume onto another world size).
"""

import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from . import dist


def shard_dir(path: Path) -> Path:
    """The shard directory of a checkpoint file: step_N.pt -> step_N.dcp."""
    return path.with_suffix(".dcp")


def save(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """All ranks write their shards of model and optimizer into shard_dir(path). A collective."""
    final = shard_dir(path)
    tmp = final.with_name(final.name + ".tmp")
    failed = None
    if dist.is_main():  # a crashed save's leftovers; no other process writes here (run.lock)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
        except OSError as err:  # a read-only or full file system
            failed = err
    failed = dist.from_main(failed)  # every rank raises it, none waits alone in a collective
    if failed:
        raise failed
    # FQN-keyed state dicts ("net.0.weight"), the same whatever the wrapping and world size.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    except BaseException:  # a full disk, or a second Ctrl-C: leave no partial directory behind
        if dist.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()  # every rank's shards are on disk
    if dist.is_main():
        shutil.rmtree(final, ignore_errors=True)  # a save of this step whose .pt never came
        tmp.rename(final)


def load(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Read model and optimizer shards into a sharded model, whatever world size wrote them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the slices to fill
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def load_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load whole (unsharded) weights into a sharded model: each rank keeps its slices."""
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))


def verify(directory: Path) -> Metadata:
    """The metadata of a shard directory, once each shard file it names holds the bytes it needs.

    Each stored item is a byte range (offset, length) of a file: a file shorter than its last
    range was cut short (a full disk, an interrupted copy). The data itself is not read.
    """
    metadata = dcp.FileSystemReader(directory).read_metadata()
    needed: dict[str, int] = {}
    for item in metadata.storage_data.values():
        end = item.offset + item.length
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"shard file {path} is missing")
        if path.stat().st_size < size:
            raise ValueError(
                f"shard file {path} is truncated: {path.stat().st_size} bytes of at least {size}"
            )
    return metadata


def shapes(directory: Path) -> dict[str, torch.Tensor]:
    """The model's tensors as shapes only (meta device), from the verified metadata."""
    metadata = verify(directory).state_dict_metadata
    return {
        key.removeprefix("model."): torch.empty(
            tuple(item.size), dtype=item.properties.dtype, device="meta"
        )
        for key, item in metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }


def full_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The whole model as plain CPU tensors (for --init-from); needs no process group."""
    weights = {name: torch.empty_like(t, device="cpu") for name, t in shapes(directory).items()}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": we know
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": weights}, checkpoint_id=directory, no_dist=True)
    return weights
