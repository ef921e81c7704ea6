"""FSDP and DDP's communication hooks, each compared with plain DDP on the same work.

Every run here is 2 CPU processes over gloo with the tiny problem of helpers.TINY: batch 4 per
rank and accumulation 2 (16 samples per optimizer step, 4 steps per epoch), AdamW at lr 0.01.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import (
    TOLERANCE,
    cpu_fp16_autocast_works,
    launch,
    load_model,
    max_difference,
    read_metrics,
    same_parameters,
)

pytestmark = [
    pytest.mark.slow,  # deselect with -m "not slow" for a quick run
    pytest.mark.skipif(os.name == "nt", reason="the multi-process runs need POSIX signals"),
]

LAYOUT = ["--batch-size=4", "--grad-accum-steps=2"]
STEPS = 30  # long enough for PowerSGD to compress 20 steps (strategy.POWERSGD_START = 10)
LR = 0.01  # helpers.TINY


def step_file(step: int) -> Path:
    return Path("checkpoints", f"step_{step:08d}.pt")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain DDP (fp32 all-reduce), the run everything here is compared with."""
    out_dir = tmp_path_factory.mktemp("ddp")
    launch(out_dir, *LAYOUT, f"--max-steps={STEPS}", "--ckpt-every=15", "--strategy=ddp", nproc=2)
    return out_dir


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("fsdp")
    launch(out_dir, *LAYOUT, f"--max-steps={STEPS}", "--ckpt-every=15", "--strategy=fsdp", nproc=2)
    return out_dir


# ---------------------------------------------------------------- DDP communication hooks

# A 16-bit all-reduce rounds each averaged gradient to p significant bits: a relative error of
# at most 2^-p per element and step (bf16 p = 8, fp16 p = 11). AdamW's update is about lr per
# element whatever the gradient's scale, and changes by about that relative error, so after
# STEPS steps the parameters differ by at most STEPS x lr x 2^-p: 1.2e-3 (bf16), 1.5e-4 (fp16).
# Measured: 2.8e-4 and 3.9e-5. Gradients not averaged over the ranks would differ by ~lr.
HOOK_TOLERANCE = {"bf16": STEPS * LR * 2**-8, "fp16": STEPS * LR * 2**-11}


@pytest.mark.parametrize("hook", ["bf16", "fp16"])
def test_16_bit_compression_stays_within_its_rounding(
    ddp_run: Path, tmp_path: Path, hook: str
) -> None:
    args = [*LAYOUT, f"--max-steps={STEPS}", "--strategy=ddp", f"--comm-hook={hook}"]
    launch(tmp_path, *args, nproc=2)
    final = step_file(STEPS)
    difference = max_difference(load_model(ddp_run / final), load_model(tmp_path / final))
    print(f"--comm-hook {hook} vs none: max |diff| {difference:.2e}")
    assert 0 < difference < HOOK_TOLERANCE[hook]  # not 0: the hook did round the gradients
    assert (
        read_metrics(tmp_path)[-1]["param_fingerprints"][0]
        == (
            read_metrics(tmp_path)[-1]["param_fingerprints"][1]  # the ranks agree bit for bit
        )
    )


def test_powersgd_is_exact_until_it_starts_then_lossy_but_bounded(
    ddp_run: Path, tmp_path: Path
) -> None:
    launch(
        tmp_path,
        *LAYOUT,
        f"--max-steps={STEPS}",
        "--ckpt-every=15",
        "--comm-hook=powersgd",
        "--strategy=ddp",
        nproc=2,
    )
    plain, compressed = read_metrics(ddp_run), read_metrics(tmp_path)
    # PowerSGD all-reduces plainly for its first 10 steps: those updates are bitwise the same,
    # so the losses of steps 1-11 (step 11's is computed before its update) are too.
    assert [r["loss"] for r in compressed[:11]] == [r["loss"] for r in plain[:11]]
    # Then a rank-2 approximation of each gradient matrix: not a rounding error, so no bound
    # from float precision. Each AdamW step moves a parameter by about lr at most, so 20
    # compressed steps cannot move one by more than 20 x lr = 0.2 (measured: 0.04)...
    final = step_file(STEPS)
    difference = max_difference(load_model(ddp_run / final), load_model(tmp_path / final))
    print(f"--comm-hook powersgd vs none: max |diff| {difference:.2e}")
    assert 0 < difference < (STEPS - 10) * LR
    # ...and error feedback makes the dropped part up later, so the model learns as well:
    # validation loss within 5 % of the uncompressed run's (measured: 1 %).
    assert compressed[-1]["eval_loss"] == pytest.approx(plain[-1]["eval_loss"], rel=0.05)


def test_powersgd_resume_restores_its_state_and_is_bitwise_exact(tmp_path: Path) -> None:
    args = [*LAYOUT, f"--max-steps={STEPS}", "--ckpt-every=15", "--comm-hook=powersgd"]
    args.append("--strategy=ddp")
    launch(tmp_path / "whole", *args, nproc=2)
    # Step 15: five steps into compression, with error feedback and Q memory in flight.
    saved = torch.load(tmp_path / "whole" / step_file(15), weights_only=True)["comm_hook"]
    assert len(saved) == 2 and all(state["iter"] == 15 and state["error_dict"] for state in saved)
    launch(tmp_path / "resumed", *args, f"--resume={tmp_path / 'whole' / step_file(15)}", nproc=2)
    final = step_file(STEPS)
    assert same_parameters(
        load_model(tmp_path / "whole" / final), load_model(tmp_path / "resumed" / final)
    )


# ---------------------------------------------------------------- FSDP


def test_fsdp_reaches_the_parameters_of_ddp(ddp_run: Path, fsdp_run: Path) -> None:
    # Same global batch, same fp32 arithmetic; only the gradient reduction differs: DDP all-
    # reduces the mean, FSDP reduce-scatters it. The sums may group differently with more
    # ranks (helpers.TOLERANCE); with 2 ranks a + b is a + b, and measured bitwise equal.
    final = step_file(STEPS)
    difference = max_difference(load_model(ddp_run / final), load_model(fsdp_run / final))
    print(f"fsdp vs ddp: max |diff| {difference:.2e}")
    assert difference < TOLERANCE
    ddp_losses = [r["loss"] for r in read_metrics(ddp_run)]
    fsdp_losses = [r["loss"] for r in read_metrics(fsdp_run)]
    assert fsdp_losses == pytest.approx(ddp_losses, rel=1e-6)
    assert read_metrics(fsdp_run)[-1]["eval_acc"] == read_metrics(ddp_run)[-1]["eval_acc"]


def test_fsdp_checkpoints_are_sharded(fsdp_run: Path) -> None:
    state = torch.load(fsdp_run / step_file(STEPS), weights_only=True)
    assert state["sharded"] and state["model"] == {} and state["optimizer"] == {}
    shards = fsdp_run / "checkpoints" / f"step_{STEPS:08d}.dcp"
    assert (shards / ".metadata").is_file() and len(list(shards.glob("*.distcp"))) == 2  # 1 a rank


def test_fsdp_resume_is_bitwise_exact(fsdp_run: Path, tmp_path: Path) -> None:
    args = [*LAYOUT, f"--max-steps={STEPS}", "--ckpt-every=15", "--strategy=fsdp"]
    launch(tmp_path, *args, f"--resume={fsdp_run / step_file(15)}", nproc=2)
    final = step_file(STEPS)
    assert same_parameters(load_model(fsdp_run / final), load_model(tmp_path / final))
    losses = {r["step"]: r["loss"] for r in read_metrics(fsdp_run)}
    assert {r["step"]: r["loss"] for r in read_metrics(tmp_path)} == {
        step: losses[step] for step in range(16, STEPS + 1)
    }


def test_fsdp_resumes_on_another_world_size(fsdp_run: Path, tmp_path: Path) -> None:
    # 2 ranks to step 15, then 1 process with twice the accumulation: the same global batch.
    # DCP reads the 2 shards of each tensor into the 1 process's whole tensor; only the order
    # of float sums changes (helpers.TOLERANCE).
    args = ["--batch-size=4", "--grad-accum-steps=4", f"--max-steps={STEPS}", "--strategy=fsdp"]
    launch(tmp_path, *args, f"--resume={fsdp_run / step_file(15)}", nproc=1)
    final = step_file(STEPS)
    difference = max_difference(load_model(fsdp_run / final), load_model(tmp_path / final))
    print(f"fsdp resumed on 1 process vs 2 ranks throughout: max |diff| {difference:.2e}")
    assert difference < TOLERANCE


def test_an_incomplete_sharded_checkpoint_is_never_resumed(fsdp_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(fsdp_run / "checkpoints", run / "checkpoints")
    shutil.copy(fsdp_run / "metrics.jsonl", run / "metrics.jsonl")
    checkpoints = run / "checkpoints"
    # A save of step 31 that died after writing its shards, before the .pt that completes them;
    # and one of step 32 that died while the shards were being written.
    shutil.copytree(checkpoints / f"step_{STEPS:08d}.dcp", checkpoints / "step_00000031.dcp")
    shutil.copytree(checkpoints / f"step_{STEPS:08d}.dcp", checkpoints / "step_00000032.dcp.tmp")
    # And a newest complete checkpoint whose shards were damaged afterwards.
    (checkpoints / f"step_{STEPS:08d}.dcp" / ".metadata").write_bytes(b"garbage")
    args = [*LAYOUT, f"--max-steps={STEPS + 2}", "--ckpt-every=15", "--strategy=fsdp"]
    result = launch(run, *args, nproc=2)
    assert f"cannot read checkpoint {checkpoints / step_file(STEPS).name}" in result.stdout
    assert f"resuming from {checkpoints / 'step_00000015.pt'} (step 15)" in result.stdout
    # The save at the end removed the leftovers; a later step_31 was written whole.
    names = sorted(p.name for p in checkpoints.iterdir())
    assert not [name for name in names if name.endswith(".tmp")], names
    assert {f"step_{STEPS + 2:08d}.pt", f"step_{STEPS + 2:08d}.dcp"} <= set(names)
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == STEPS + 2


@pytest.mark.parametrize(
    "precision",
    [
        "bf16",
        pytest.param(
            "fp16",
            marks=pytest.mark.skipif(not cpu_fp16_autocast_works(), reason="no CPU fp16 autocast"),
        ),
    ],
)
def test_fsdp_mixed_precision_trains_like_ddp(tmp_path: Path, precision: str) -> None:
    # FSDP all-gathers the parameters cast to --precision and reduces gradients in fp32; DDP
    # keeps fp32 parameters and autocast casts them op by op. Both round the same fp32 weights to
    # the same 16-bit values and run the same 16-bit matmuls, and both turn the 16-bit gradients
    # into fp32 before averaging: the same arithmetic in another place (measured: bitwise equal).
    args = [*LAYOUT, "--max-steps=10", f"--precision={precision}"]
    launch(tmp_path / "ddp", *args, "--strategy=ddp", nproc=2)
    launch(tmp_path / "fsdp", *args, "--strategy=fsdp", nproc=2)
    ddp_losses = [r["loss"] for r in read_metrics(tmp_path / "ddp")]
    fsdp_losses = [r["loss"] for r in read_metrics(tmp_path / "fsdp")]
    worst = max(abs(f - d) / d for f, d in zip(fsdp_losses, ddp_losses, strict=True))
    print(f"{precision}: fsdp vs ddp losses, max relative difference {worst:.2e}")
    assert fsdp_losses == pytest.approx(ddp_losses, rel=1e-6)
    final = step_file(10)
    assert (
        max_difference(load_model(tmp_path / "ddp" / final), load_model(tmp_path / "fsdp" / final))
        < TOLERANCE
    )
    assert fsdp_losses[-1] < fsdp_losses[0]  # it learns
