"""Run the launch scripts in scripts/ for real: CPU processes with gloo, a tiny model, a few steps.

SLURM is replaced by the stand-ins in tests/fake_slurm/ (srun, scontrol, scancel), put first
on PATH: the fake srun starts every node's torchrun on this machine with the SLURM_*
variables a real job step would see. A script that the project does not include is skipped.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
FAKE_SLURM = Path(__file__).resolve().parent / "fake_slurm"
SHELL_FILES = sorted(SCRIPTS.glob("*.sh")) + sorted(SCRIPTS.glob("*.sbatch"))
SHELL_FILES += sorted(FAKE_SLURM.glob("s*"))
TIMEOUT = 120  # seconds; a hung rendezvous fails the test instead of the whole run

pytestmark = pytest.mark.skipif(
    sys.platform == "win32" or shutil.which("bash") is None,
    reason="the launch scripts need bash on Linux or macOS",
)


def tiny_run(out_dir: Path, max_steps: int) -> list[str]:
    """Training flags for a run of a few seconds on CPU."""
    return [
        "--device=cpu",
        "--precision=fp32",
        f"--max-steps={max_steps}",
        "--batch-size=4",
        "--num-samples=64",
        "--val-samples=64",
        "--input-dim=8",
        "--hidden-dim=16",
        "--depth=1",
        "--num-classes=4",
        "--log-every=1",
        "--num-workers=0",
        f"--out-dir={out_dir}",
    ]


def script_env(**extra: str) -> dict[str, str]:
    """The environment of a launch: this interpreter, sources from src/, no restarts."""
    env = dict(os.environ)
    pythonpath = [str(ROOT / "src"), env.get("PYTHONPATH", "")]
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in pythonpath if p),
        PYTHON=sys.executable,
        MAX_RESTARTS="0",  # a failure shows at once instead of after three restarts
    )
    env.update(extra)
    return env


def require(name: str) -> Path:
    """Path of scripts/NAME; skip the test when the project does not include it."""
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"scripts/{name} is not part of this project")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start cmd in its own process group, output to log."""
    with log.open("w") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def finish(proc: subprocess.Popen, log: Path, timeout: float = TIMEOUT) -> int:
    """Wait for proc; on timeout kill its process group and fail with the log."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{proc.args} timed out after {timeout} s:\n{log.read_text()[-4000:]}")


def run(cmd: list[str], env: dict[str, str], log: Path) -> int:
    return finish(start(cmd, env, log), log)


def logged_steps(out_dir: Path) -> list[int]:
    """Steps in metrics.jsonl so far (complete lines only: the run may be writing one)."""
    path = out_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line)["step"] for line in lines]


def wait_for_steps(proc: subprocess.Popen, out_dir: Path, count: int, log: Path) -> None:
    """Wait until metrics.jsonl holds `count` steps, i.e. training is under way."""
    deadline = time.monotonic() + TIMEOUT
    while len(logged_steps(out_dir)) < count:
        assert proc.poll() is None, log.read_text()
        if time.monotonic() > deadline:
            finish(proc, log, timeout=0)
        time.sleep(0.1)


def assert_finished(out_dir: Path, max_steps: int) -> None:
    """metrics.jsonl reaches the last step, and its checkpoint was written."""
    assert logged_steps(out_dir)[-1] == max_steps
    assert (out_dir / "checkpoints" / f"step_{max_steps:08d}.pt").is_file()


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_shell_syntax(path: Path) -> None:
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


@pytest.mark.slow
def test_train_local_two_processes(tmp_path: Path) -> None:
    script = require("train_local.sh")
    out, log = tmp_path / "run", tmp_path / "local.log"
    rc = run(["bash", str(script), *tiny_run(out, 4)], script_env(NPROC="2"), log)
    assert rc == 0, log.read_text()
    assert_finished(out, 4)


@pytest.mark.slow
def test_train_local_sigterm_saves_and_exits_143(tmp_path: Path) -> None:
    script = require("train_local.sh")
    out, log = tmp_path / "run", tmp_path / "local.log"
    # Far more steps than the test waits for; only SIGTERM writes a checkpoint (--ckpt-every=0).
    cmd = ["bash", str(script), *tiny_run(out, 1_000_000), "--ckpt-every=0"]
    proc = start(cmd, script_env(NPROC="2"), log)
    wait_for_steps(proc, out, 3, log)
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc, log) == 143, log.read_text()
    stopped_at = logged_steps(out)[-1]
    saved = sorted(path.name for path in (out / "checkpoints").glob("step_*.pt"))
    assert saved == [f"step_{stopped_at:08d}.pt"], log.read_text()


@pytest.mark.slow
def test_train_multinode_two_nodes_on_localhost(tmp_path: Path) -> None:
    script = require("train_multinode.sh")
    out = tmp_path / "run"
    common = dict(NNODES="2", NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1")
    common.update(MASTER_PORT=str(free_port()), RDZV_ID="test")
    logs = [tmp_path / f"node{rank}.log" for rank in (0, 1)]
    procs = [
        start(
            ["bash", str(script), *tiny_run(out, 4)], script_env(NODE_RANK=str(rank), **common), log
        )
        for rank, log in zip((0, 1), logs, strict=True)
    ]
    codes = [finish(proc, log) for proc, log in zip(procs, logs, strict=True)]
    assert codes == [0, 0], "\n".join(log.read_text() for log in logs)
    assert_finished(out, 4)


def slurm_env(tmp_path: Path) -> dict[str, str]:
    """What sbatch would give the batch script: a 2-node allocation of this machine."""
    state = tmp_path / "slurm"
    state.mkdir(exist_ok=True)
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():  # copied so that the stand-ins are executable wherever we run
        shutil.copytree(FAKE_SLURM, bin_dir)
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
    return script_env(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        FAKE_SLURM_STATE=str(state),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="test",
        SLURM_NNODES="2",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="localhost,localhost",
        SLURM_SUBMIT_DIR=str(tmp_path),
        NPROC_PER_NODE="1",
        MASTER_PORT=str(free_port()),
    )


@pytest.mark.slow
def test_train_slurm_two_nodes(tmp_path: Path) -> None:
    script = require("train_slurm.sbatch")
    out, log = tmp_path / "run", tmp_path / "job.log"
    rc = run(["bash", str(script), *tiny_run(out, 4)], slurm_env(tmp_path), log)
    assert rc == 0, log.read_text()
    assert_finished(out, 4)
    assert not (tmp_path / "slurm" / "scontrol.log").exists()  # finished: not requeued


@pytest.mark.slow
def test_train_slurm_time_limit_requeues_and_resumes(tmp_path: Path) -> None:
    script = require("train_slurm.sbatch")
    out, env = tmp_path / "run", slurm_env(tmp_path)
    # Far more steps than the test waits for; only SIGTERM writes a checkpoint (--ckpt-every=0).
    job = ["bash", str(script), *tiny_run(out, 1_000_000), "--ckpt-every=0"]
    requeue_log = tmp_path / "slurm" / "scontrol.log"

    # SLURM warns the batch script 120 s before the time limit (--signal=B:USR1@120).
    log = tmp_path / "first.log"
    proc = start(job, env, log)
    wait_for_steps(proc, out, 3, log)
    os.kill(proc.pid, signal.SIGUSR1)
    assert finish(proc, log) == 143, log.read_text()
    assert requeue_log.read_text().split() == ["requeue", "4242"], log.read_text()
    stopped_at = logged_steps(out)[-1]
    saved = sorted(path.name for path in (out / "checkpoints").glob("step_*.pt"))
    assert saved == [f"step_{stopped_at:08d}.pt"], log.read_text()

    # The requeued job runs the same command and resumes at the next step. A plain SIGTERM
    # (`scancel JOBID`) stops it with a checkpoint too, but does not requeue it.
    log = tmp_path / "second.log"
    env["SLURM_RESTART_COUNT"] = "1"
    before = len(logged_steps(out))
    proc = start(job, env, log)
    wait_for_steps(proc, out, before + 3, log)
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc, log) == 143, log.read_text()
    steps = logged_steps(out)
    assert steps[before] == stopped_at + 1, log.read_text()
    assert (out / "checkpoints" / f"step_{steps[-1]:08d}.pt").is_file(), log.read_text()
    assert requeue_log.read_text().split() == ["requeue", "4242"], log.read_text()
