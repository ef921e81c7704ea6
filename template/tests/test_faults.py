"""Faults: a killed, crashed, stalled or preempted rank, a crash during a save, NaNs and
infinities, and a resume on another world size. Nothing may be lost or hang.

Multi-process runs start tests/faults.py under torchrun: it is the training entry point with
one fault injected on one rank at one step. Each run is compared with the uninterrupted
2-rank reference run (conftest.reference) where that is meaningful.
"""

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import (
    REFERENCE,
    STEP_5,
    STEP_10,
    STRATEGY,
    TINY,
    checkpoint_files,
    copy_checkpoint,
    cpu_fp16_autocast_works,
    launch,
    launch_command,
    load_model,
    max_difference,
    read_metrics,
    same_parameters,
    saved_steps,
    small_disk,
    start_long_run,
    training_env,
    wait_for_steps,
)

FAULTS = Path(__file__).resolve().parent / "faults.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.name == "nt", reason="the fault runs need POSIX signals"),
]


def run_fault(
    out_dir: Path,
    fault: str,
    rank: int,
    step: int,
    *args: str,
    nproc: int = 2,
    torchrun_args: tuple[str, ...] = (),
) -> tuple[int, str, float]:
    """Train with `fault` on `rank` at `step`; returns exit status, output and seconds taken."""
    fault_args = [f"--fault={fault}", f"--rank={rank}", f"--step={step}", "--"]
    cmd = [str(FAULTS), *fault_args, *TINY, f"--out-dir={out_dir}", *args]
    if nproc > 1:
        torchrun = ["-m", "torch.distributed.run", "--standalone", *torchrun_args]
        cmd = [*torchrun, f"--nproc_per_node={nproc}", *cmd]
    return run([sys.executable, *cmd])


def run(cmd: list[str]) -> tuple[int, str, float]:
    """Run a command; returns exit status, output (stdout and stderr) and seconds taken."""
    started = time.monotonic()
    result = subprocess.run(
        cmd,
        env=training_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order things happened
        text=True,
        timeout=120,
    )
    return result.returncode, result.stdout, time.monotonic() - started


def rank_exit_codes(output: str) -> set[str]:
    """The exit statuses of the ranks in torchrun's failure report."""
    return set(re.findall(r"exitcode\s*:\s*(-?\d+)", output))


def test_killed_rank_is_restarted_and_the_result_is_unchanged(
    reference: Path, tmp_path: Path
) -> None:
    # SIGKILL rank 0, the one that writes, at step 7, after the checkpoint of step 5. Rank 1's
    # collective fails at once; torchrun restarts both, and they resume from step 5.
    restart = ("--max-restarts=1",)
    status, output, _ = run_fault(tmp_path, "sigkill", 0, 7, *REFERENCE, torchrun_args=restart)
    assert status == 0, output
    assert f"resuming from {tmp_path / STEP_5} (step 5)" in output
    # The killed rank 0 could not remove its lock; the restarted one takes it over.
    assert f"warning: taking over {tmp_path / 'run.lock'}, left by a run that is gone" in output
    assert not (tmp_path / "run.lock").exists()
    assert [r["step"] for r in read_metrics(tmp_path)] == [*range(1, 7), *range(6, 11)]
    assert same_parameters(load_model(reference / STEP_10), load_model(tmp_path / STEP_10))


def test_sigterm_to_torchrun_saves_and_the_rerun_is_unchanged(
    reference: Path, tmp_path: Path
) -> None:
    # As a scheduler does: SIGTERM to torchrun (during step 3), which passes it on to every
    # rank. The ranks agree on it during step 4 (in the background), and stop after step 4.
    status, output, _ = run_fault(tmp_path, "sigterm-launcher", 0, 3, *REFERENCE)
    # torchrun exits 1 with a SignalException traceback; the ranks exited 143 in time (torchrun
    # says "forcefully exiting" when it has to SIGKILL them).
    assert status == 1 and "SignalException" in output, output
    assert "SIGTERM: saved step 4; rerun to resume. Exit 143." in output
    assert "forcefully exiting" not in output
    assert saved_steps(tmp_path) == [4]
    # The same command again resumes at step 4 and ends where an uninterrupted run ends.
    rerun = launch(tmp_path, *REFERENCE, nproc=2)
    assert "(step 4)" in rerun.stdout
    assert same_parameters(load_model(reference / STEP_10), load_model(tmp_path / STEP_10))


def test_ctrl_c_to_torchrun_saves_once_and_every_rank_exits_130(
    reference: Path, tmp_path: Path
) -> None:
    # Ctrl-C at a terminal signals torchrun (its processes run in sessions of their own), and
    # torchrun passes SIGINT on to every rank. As with SIGTERM, the ranks agree during step 4
    # and stop after it, with one checkpoint.
    status, output, _ = run_fault(tmp_path, "sigint-launcher", 0, 3, *REFERENCE)
    assert status == 1 and "SignalException" in output, output  # torchrun itself
    assert output.count("interrupted (Ctrl-C): saved step 4; rerun to resume. Exit 130.") == 1
    assert sorted(re.findall(r"fault: rank (\d) exits (\d+)", output)) == [
        ("0", "130"),
        ("1", "130"),
    ], output
    assert "forcefully exiting" not in output and "KeyboardInterrupt" not in output
    assert saved_steps(tmp_path) == [4]
    rerun = launch(tmp_path, *REFERENCE, nproc=2)
    assert "(step 4)" in rerun.stdout
    assert same_parameters(load_model(reference / STEP_10), load_model(tmp_path / STEP_10))


@pytest.mark.parametrize("slow_save", ["slow-save", "big-save"])
def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path: Path, slow_save: str) -> None:
    # The first Ctrl-C makes the run stop after the next step and save it; this save takes a
    # minute, or seconds inside torch.save's C++ code (faults.py), and a second Ctrl-C during
    # it stops the run at once, with no abort (SIGABRT, "terminate called ...") of the thread.
    fault = [str(FAULTS), f"--fault={slow_save}", "--step=0", "--"]
    args = [*TINY, "--max-steps=100000", "--ckpt-every=0", f"--out-dir={tmp_path}"]
    process = subprocess.Popen(
        [sys.executable, *fault, *args],
        env=training_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for_steps(tmp_path, 3, process)
    process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "checkpoints").glob("*.pt.tmp")):  # the save has begun
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130, output
    if slow_save == "slow-save":
        assert time.monotonic() - started < 10, output  # not after the minute-long save
    assert output.splitlines()[-1] == (
        "interrupted again (Ctrl-C): stopped at once, without saving; rerun to resume from the"
        " newest checkpoint"
    ), output
    assert "Traceback" not in output and "terminate" not in output
    assert checkpoint_files(tmp_path / "checkpoints") == []  # no checkpoint, no partial file
    assert not (tmp_path / "run.lock").exists()


def test_a_run_whose_lock_was_taken_over_stops_before_its_next_write(tmp_path: Path) -> None:
    # A run paused (SIGSTOP) for so long that a run on another host took its --out-dir over
    # (the heartbeat was stale): once continued, it finds run.lock no longer its own, writes
    # nothing more (no metrics line, no checkpoint, no deletion) and stops, exit 1.
    process = start_long_run(tmp_path, 1, "--ckpt-every=2")
    wait_for_steps(tmp_path, 4, process)
    process.send_signal(signal.SIGSTOP)
    other = '{"host": "elsewhere", "pid": 7, "started": "later"}'
    (tmp_path / "run.lock").write_text(other)
    theirs = tmp_path / "checkpoints" / "step_00000001.pt.tmp"  # the new owner's save
    theirs.write_bytes(b"being written")
    lines = (tmp_path / "metrics.jsonl").read_text()
    before = set(checkpoint_files(tmp_path / "checkpoints"))
    process.send_signal(signal.SIGCONT)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 1, output
    error = output.splitlines()[-1]
    assert error.startswith(
        f"error: {tmp_path / 'run.lock'} was taken over by another run (host elsewhere, pid 7,"
    ), output
    assert "all ranks stopped at step" in error and "Traceback" not in output
    assert (tmp_path / "metrics.jsonl").read_text() == lines
    after = set(checkpoint_files(tmp_path / "checkpoints"))
    # Nothing deleted; at most the save the pause interrupted was completed (its .tmp renamed).
    finished = {name.removesuffix(".tmp") for name in before}
    assert {name for name in before if name.endswith(".pt")} <= after <= finished | before
    assert theirs.exists()
    assert (tmp_path / "run.lock").read_text() == other  # the new owner's lock stays


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_full_disk_stops_every_rank_with_one_line(tmp_path: Path, strategy: str) -> None:
    # The disk fills during step 3; step 4's save fails: under FSDP every rank's shards, with
    # torch.distributed.checkpoint's CheckpointException (not an Exception).
    run = tmp_path / "disk"
    with small_disk(run):
        args = ["--max-steps=8", "--ckpt-every=2", f"--strategy={strategy}"]
        status, output, _ = run_fault(run, "fill-disk", 0, 3, *args)
        assert status == 1, output
        assert rank_exit_codes(output) == {"1"}, output
        ranks = output.split("fault: rank")[0]  # what the ranks printed, before torchrun's
        assert "Traceback" not in ranks, output
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, output
        assert "o space left on device" in errors[0], output
        assert errors[0].endswith(f"the newest checkpoint is step 2 ({run / STEP_2})"), output
        assert saved_steps(run) == [2]


def test_sigterm_near_the_end_lets_the_run_finish(tmp_path: Path) -> None:
    # SIGTERM during step 9 of 10: the ranks agree on it during step 10, the last one, so the
    # run simply finishes: the final checkpoint and summary, no preemption message.
    status, output, _ = run_fault(tmp_path, "sigterm-launcher", 0, 9, *REFERENCE)
    assert status == 1 and "SignalException" in output, output  # torchrun itself was signalled
    assert "SIGTERM: saved" not in output and "done: 10 steps" in output, output
    assert saved_steps(tmp_path) == [5, 10]
    assert "forcefully exiting" not in output


def test_kill_during_a_save_keeps_the_previous_checkpoint(
    train_here: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # One process writes half of step 10's temporary file, then is SIGKILLed.
    run = tmp_path / "run"
    status, output, _ = run_fault(run, "sigkill-in-save", 0, 10, *REFERENCE, nproc=1)
    assert status == -9, output
    checkpoints = checkpoint_files(run / "checkpoints")
    assert checkpoints == ["step_00000005.pt", "step_00000010.pt.tmp"]  # no partial step_10.pt
    # Rerunning ignores the temporary file, resumes from step 5, and the save of step 10
    # removes it; the result is that of an uninterrupted run.
    assert train_here(*REFERENCE, out_dir=run) == 0
    assert f"resuming from {run / STEP_5} (step 5)" in capsys.readouterr().out
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert train_here(*REFERENCE, out_dir=tmp_path / "uninterrupted") == 0
    expected = load_model(tmp_path / "uninterrupted" / STEP_10)
    assert same_parameters(expected, load_model(run / STEP_10))


# A global batch of 12 (2 ranks x 6 x 1, or 1 x 4 x 3): 64 training samples are 5 steps per
# epoch, and 4 samples of each epoch are left out, whatever the split (a short last step would
# depend on it: 4 samples make a micro-batch of 4, not of 6). Step 4 is in the middle of an epoch.
# Micro-batches of other sizes sum in another order, which AdamW amplifies where a gradient is
# near zero: 1.2e-5 measured (lm), above TOLERANCE; a wrong data position moves them by ~1e-2.
SPLIT_TOLERANCE = 1e-4
TWO_RANKS = ["--batch-size=6", "--grad-accum-steps=1", "--max-steps=8", "--ckpt-every=4"]
ONE_PROCESS = ["--batch-size=4", "--grad-accum-steps=3", "--max-steps=8", "--ckpt-every=4"]
STEP_4, STEP_8 = Path("checkpoints", "step_00000004.pt"), Path("checkpoints", "step_00000008.pt")
STEP_2 = Path("checkpoints", "step_00000002.pt")


def test_resume_on_another_world_size_with_the_same_global_batch(
    train_here: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    two, one = tmp_path / "two", tmp_path / "one"
    launch(two, *TWO_RANKS, nproc=2)
    assert train_here(*ONE_PROCESS, out_dir=one) == 0
    # The split of the global batch changes nothing but the order of float sums.
    assert max_difference(load_model(two / STEP_8), load_model(one / STEP_8)) < SPLIT_TOLERANCE
    # 2 ranks -> 1 process, and 1 process -> 2 ranks, from step 4 (mid-epoch) to step 8.
    assert train_here(*ONE_PROCESS, f"--resume={two / STEP_4}", out_dir=tmp_path / "2to1") == 0
    out = capsys.readouterr().out
    assert "RNG states are not restored, so the run is not bitwise" in out  # no comm hook:
    assert "PowerSGD" not in out  # nothing said of PowerSGD's state
    launch(tmp_path / "1to2", *TWO_RANKS, f"--resume={one / STEP_4}", nproc=2)
    for resumed, straight in (("2to1", two), ("1to2", one)):
        # The model has no dropout, so the RNG does not matter (see SPLIT_TOLERANCE).
        difference = max_difference(
            load_model(straight / STEP_8), load_model(tmp_path / resumed / STEP_8)
        )
        print(f"resumed {resumed} vs straight: max |diff| {difference:.2e}")
        assert difference < SPLIT_TOLERANCE
        assert read_metrics(tmp_path / resumed)[0]["step"] == 5  # no step lost or repeated


def test_exact_resume_with_a_model_that_draws_random_numbers(tmp_path: Path) -> None:
    # Dropout on two ranks: each rank's random draws are saved and restored, and nothing else
    # draws from the generators between steps (a data loader's iterator did), so a resumed
    # run draws the same masks as the straight run.
    args = [*REFERENCE, "--keep-last=2"]
    status, output, _ = run_fault(tmp_path / "straight", "dropout", 0, 0, *args)
    assert status == 0, output
    copy_checkpoint(tmp_path / "straight" / STEP_5, tmp_path / "resumed" / STEP_5)
    status, output, _ = run_fault(tmp_path / "resumed", "dropout", 0, 0, *args)
    assert status == 0 and "(step 5)" in output, output
    straight = load_model(tmp_path / "straight" / STEP_10)
    assert same_parameters(straight, load_model(tmp_path / "resumed" / STEP_10))
    # The dropout did draw: without it, training lands elsewhere.
    launch(tmp_path / "plain", *args, nproc=2)
    assert max_difference(straight, load_model(tmp_path / "plain" / STEP_10)) > 1e-3


def test_resume_with_another_global_batch_is_refused(
    reference: Path, train_here: Callable[..., int], capsys: pytest.CaptureFixture
) -> None:
    args = ["--batch-size=4", "--grad-accum-steps=2", "--max-steps=10"]
    assert train_here(*args, f"--resume={reference / STEP_5}") == 2  # 1 x 4 x 2 = 8, not 16
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "global batch (--batch-size x --grad-accum-steps x world size) 16" in err
    assert "in the checkpoint, 8 now (--global-batch-size 16 keeps it)" in err


@pytest.mark.skipif(not cpu_fp16_autocast_works(), reason="this torch has no CPU fp16 autocast")
def test_fp16_overflow_on_one_rank_is_skipped_and_counted(tmp_path: Path) -> None:
    # An infinite gradient on rank 1 at step 3 reaches both ranks through the all-reduce
    # (FSDP: the GradScaler's check of the sharded gradients is itself reduced over the ranks);
    # both GradScalers skip that update, and training goes on.
    args = ["--precision=fp16", "--max-steps=6", "--grad-clip=0"]
    status, output, _ = run_fault(tmp_path, "inf-grad", 1, 3, *args)
    assert status == 0, output
    records = {r["step"]: r for r in read_metrics(tmp_path)}
    assert records[3]["skipped_steps"] == records[2]["skipped_steps"] + 1
    assert records[3]["grad_norm"] is None
    assert records[6]["skipped_steps"] == records[3]["skipped_steps"]
    if STRATEGY == "ddp":  # FSDP has no replicas
        fingerprints = records[6]["param_fingerprints"]
        assert fingerprints[0] == fingerprints[1]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_nan_on_one_rank_stops_all_ranks_at_once(tmp_path: Path, precision: str) -> None:
    # Only rank 1 sees a NaN at step 3. A rank left waiting in a collective would keep the job
    # alive until --dist-timeout.
    if precision == "fp16" and not cpu_fp16_autocast_works():
        pytest.skip("this torch has no CPU fp16 autocast")
    args = [f"--precision={precision}", "--ckpt-every=1", "--dist-timeout=60"]
    status, output, seconds = run_fault(tmp_path, "nan-loss", 1, 3, *args)
    assert status == 1, output
    # The NaN gradients reach both ranks through the all-reduce, and both skip the update on
    # the device (fp16: the GradScaler does). Every step saves here, so every step checks:
    # both stop at step 3 and save nothing after the NaN.
    expected = (
        "non-finite loss on some rank at step 3; its update was not applied, and all ranks"
        " stopped at step 3."
    )
    assert saved_steps(tmp_path) == [1, 2]
    assert f"error: {expected}" in output
    assert "--detect-anomaly" in output
    assert rank_exit_codes(output) == {"1"}, output  # both ranks exited by themselves
    assert seconds < 30, output


def test_nan_between_checks_stops_all_ranks_at_the_next_check(tmp_path: Path) -> None:
    # Steps that neither log, evaluate nor save never wait for a value from the device: the
    # NaN of step 3 on rank 1 is skipped on the device by both ranks, and found at step 5.
    args = ["--log-every=5", "--ckpt-every=0", "--eval-every=0", "--dist-timeout=60"]
    status, output, _ = run_fault(tmp_path, "nan-loss", 1, 3, *args)
    assert status == 1, output
    assert (
        "error: non-finite loss on some rank at step 3; its update was not applied, and all"
        " ranks stopped at step 5." in output
    ), output
    assert saved_steps(tmp_path) == []  # nothing is saved after a NaN
    assert rank_exit_codes(output) == {"1"}, output


def test_exception_on_one_rank_ends_the_job(tmp_path: Path) -> None:
    # Rank 1 raises at step 3; rank 0, waiting in a collective, sees the connection close.
    status, output, seconds = run_fault(tmp_path, "raise", 1, 3, "--dist-timeout=20")
    assert status == 1, output
    assert "[rank1]: RuntimeError: injected fault: this rank failed" in output  # its traceback
    assert "error: rank 0: a collective failed" in output
    assert rank_exit_codes(output) == {"1"}, output
    assert not (tmp_path / "run.lock").exists()  # rank 0 removed it before exiting
    assert seconds < 20, output  # well before --dist-timeout would have expired


def test_stalled_rank_times_out(tmp_path: Path) -> None:
    # Rank 1 sleeps forever at step 3. Rank 0's collective times out after --dist-timeout and
    # it exits 1; torchrun then sends SIGTERM to rank 1, which is stuck and cannot act on it,
    # and kills it 30 s later (torch 2.13 waits 30 s whatever --shutdown-timeout says).
    status, output, seconds = run_fault(tmp_path, "stall", 1, 3, "--dist-timeout=4")
    assert status == 1, output
    assert "Timed out waiting 4000ms" in output
    assert "stalled for longer than --dist-timeout (4 s)" in output
    assert rank_exit_codes(output) == {"1", "-9"}, output  # rank 1 was SIGKILLed
    print(f"a stalled rank ended the job in {seconds:.1f} s")
    assert seconds < 4 + 30 + 30, output


def test_bad_flag_under_torchrun_is_reported_once(tmp_path: Path) -> None:
    # Every rank finds the mistake before any process group exists; only rank 0 reports it.
    args = [*TINY, "--global-batch-size=12", f"--out-dir={tmp_path}"]
    status, output, _ = run(launch_command(2, args))
    assert status == 1, output  # torchrun's status when a rank failed
    message = "error: --global-batch-size 12 must be a multiple of --batch-size x world size"
    assert output.count(message) == 1, output
    # Rank 0 exits 2; torchrun then stops the other rank with SIGTERM: it exits 2 as well, or
    # dies of the signal (-15) when it was still importing torch.
    assert rank_exit_codes(output) in ({"2"}, {"2", "-15"}), output
    assert not any(tmp_path.iterdir())


def test_a_mistake_only_one_rank_finds_is_reported_by_that_rank(tmp_path: Path) -> None:
    # As --device cuda with more processes than GPUs: rank 0's settings are fine, so it cannot
    # report rank 1's mistake. Rank 1 waits for a SIGTERM that does not come, then reports it.
    status, output, _ = run_fault(tmp_path, "bad-settings", 1, 0, "--dist-timeout=20")
    assert status == 1, output
    assert output.count("error: rank 1: injected: this rank's settings are invalid") == 1, output
    assert "2" in rank_exit_codes(output), output
