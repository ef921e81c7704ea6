"""Smoke test of the benchmark harness (`python -m bench`): it runs and reports every contender.

No speed assertions here: figures belong to `python -m bench`, not to timed tests.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_quick_reports_every_installed_contender(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "bench", "--quick", "--tiny", "--repeats", "1", "--warmup", "1",
        "--timed", "3", "--world-sizes", "2", "--no-data-wait", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert str(out) in done.stdout  # the results path is printed

    result = json.loads(out.read_text())
    expected = {
        "reference-same-work", "reference", "reference-fused", "generated", "generated-noeval",
        "generated-quiet", "allreduce",
    }  # fmt: skip
    optional = {"accelerate": "accelerate", "fabric": "lightning"}
    expected |= {c for c, module in optional.items() if importlib.util.find_spec(module) is not None}
    assert set(result["contenders"]) == expected
    assert set(result["skipped"]) == set(optional) - expected
    for contender in expected:
        row = result["summary"]["2"]["contenders"][contender]
        assert row["n"] == 1, contender
        rate = row["median_samples_per_sec"]
        assert rate is not None and math.isfinite(rate) and rate > 0, (contender, rate)
    runs = [r for r in result["runs"] if r["contender"] in expected]
    assert all(r["optimizer_steps_seen"] == r["warmup_steps"] + r["timed_steps"] + 1 for r in runs)
    assert all(r["world_size"] == 2 and r["global_batch"] == 32 * 4 * 2 for r in runs)
    # Ratios and targets are to the loop that does the trainer's work by hand.
    assert result["summary"]["2"]["reference"] == "reference-same-work"
    assert result["summary"]["2"]["contenders"]["reference-same-work"]["ratios_to_reference"] == [1.0]
    targets = [t["target"] for t in result["targets"]]
    assert "W=2: generated / reference-same-work >= 0.98" in targets
    assert "W=2: generated-quiet / reference-same-work >= 1.0" in targets
    assert re.search(r"^W=2 generated +per-round x ref \(wall\): \d", done.stdout, re.MULTILINE)


@pytest.mark.slow
def test_bench_lm_workload_compares_the_generated_gpt_with_the_hand_written_loop(tmp_path: Path) -> None:
    """With dropout: the trainer's keyed masks against the same-work loop's SDPA(dropout_p)."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "bench", "--workload", "lm", "--dropout", "0.1", "--quick", "--tiny",
        "--repeats", "1", "--warmup", "1", "--timed", "3", "--world-sizes", "2", "--no-data-wait",
        "--contenders", "reference-same-work,generated", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    # Every contender's plumbing is the classifier test's: here the lm workload, with two of them.
    expected = {"reference-same-work", "generated"}
    assert result["workload"]["task"] == "lm" and set(result["contenders"]) == expected
    assert (
        result["workload"]["dropout"] == 0.1 and result["summary"]["2"]["reference"] == "reference-same-work"
    )
    for contender in expected:
        rate = result["summary"]["2"]["contenders"][contender]["median_samples_per_sec"]
        assert rate is not None and math.isfinite(rate) and rate > 0, (contender, rate)
    assert all(r["global_batch"] == 8 * 4 * 2 for r in result["runs"])  # windows per step


@pytest.mark.slow
def test_gpu_bench_script_runs_on_cpu(tmp_path: Path) -> None:
    """bench/gpu.sh's Python side, at tiny sizes on CPU: an MLP and the GPT workload report."""
    out = tmp_path / "gpu.json"
    cmd = [
        sys.executable, "-m", "bench.gpu", "--device", "cpu", "--tiny", "--precision", "fp32",
        "--repeats", "1", "--contenders", "reference,generated", "--workloads", "launch,gpt2",
        "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    # At --tiny the launch and compute workloads are the same MLP: one of them is enough here.
    assert set(result["workloads"]) == {"launch", "gpt2"}
    for workload in result["workloads"].values():
        for contender in ("reference", "generated"):
            rate = workload["rows"][contender]["median_samples_per_sec"]
            assert rate is not None and math.isfinite(rate) and rate > 0, (contender, rate)
    assert "target generated >= 0.97x reference" in done.stdout
    # The attention's cost with dropout, written out (keyed masks) and in SDPA (torch's masks).
    memory = {row["attention"]: row for row in result["attention_memory"]}
    assert set(memory) == {"written-out", "sdpa", "no-dropout"}
    assert all("error" not in row and row["saved_bytes"] > 0 and row["ms"] > 0 for row in memory.values()), (
        memory
    )


@pytest.mark.slow
def test_ckpt_bench_reports_the_stall_of_every_save_under_every_load(tmp_path: Path) -> None:
    """python -m bench.ckpt at tiny sizes: one run per load, each save measured beside a synchronous one."""
    out = tmp_path / "ckpt.json"
    # Loads sized for one core: every load's kinds of process and their plumbing, fewer of them.
    cmd = [
        sys.executable, "-m", "bench.ckpt", "--tiny", "--saves", "2", "--ckpt-every", "10",
        "--threads", "1", "--cores", "1", "--settle", "0.5", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert str(out) in done.stdout
    result = json.loads(out.read_text())
    runs = {r["load"]: r for r in result["runs"]}
    assert set(runs) == {"idle", "busy", "heavy"}
    assert {load: r["load_processes"] for load, r in runs.items()} == {"idle": 0, "busy": 1, "heavy": 3}
    for load, run in runs.items():
        assert "error" not in run, (load, run["error"])
        saves = run["analysis"]["saves"]
        skipped = run["analysis"]["skipped"]
        # Every save but the last step's is measured, or skipped with the reason: under load a
        # write may end after the run's last step, and its stall cannot be told then.
        assert sorted([s["step"] for s in saves] + [s["step"] for s in skipped]) == [10, 20], (load, run)
        assert all(s["why"] == "the run ended before its write and tail did" for s in skipped), skipped
        for s in saves:
            assert s["sync_save_s"] > 0 and s["write_s"] > 0 and math.isfinite(s["ratio"]), (load, s)
            assert s["ckpt_stall_s"] is not None and s["ckpt_stall_s"] > 0, (load, s)  # from metrics.jsonl
            assert s["steps_counted"] >= 2, (load, s)  # the save's step and the tail
        assert run["analysis"]["quiet_steps"] >= 1 and run["summary"]["step_s"] > 0
    # A save is skipped only when the machine is slower than the run's tail: one measured in all.
    assert any(r["analysis"]["saves"] for r in runs.values()), runs
    assert [t["target"].split(":")[0] for t in result["targets"]] == ["idle", "busy"]


@pytest.mark.slow
def test_data_rss_bench_reports_every_rank_of_both_runs(tmp_path: Path) -> None:
    """python -m bench.data_rss on a small CSV: the peak memory of each rank, converting and cached."""
    out = tmp_path / "rss.json"
    cmd = [sys.executable, "-m", "bench.data_rss", "--size-mb", "2", "--steps", "2", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [run["run"] for run in result["runs"]] == ["converts", "cached"]
    for run in result["runs"]:
        assert sorted(run["ranks"]) == ["0", "1"], run
        assert all(peak["VmHWM"] > 0 and peak["RssAnon"] > 0 for peak in run["ranks"].values())
    assert result["file_bytes"] >= 2 << 20 and result["cache_bytes"] > 0


def test_step_bench_times_every_variant_on_both_ranks(tmp_path: Path) -> None:
    """python -m bench.step at W=2: every variant timed on both clocks, ratios to same-work."""
    out = tmp_path / "step.json"
    cmd = [sys.executable, "-m", "bench.step", "--rounds", "2", "--steps", "1", "--world-size", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*cmd, "--json", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())["results"]
    assert result["world_size"] == 2
    for clock in ("cpu", "wall"):
        times = result[clock]
        assert set(times["ms"]) == {
            "same-work",
            "same-work-again",
            "generated",
            "loop",
            "generated-forward",
            "generated-update",
        }
        assert all(len(ms) == 2 and min(ms) > 0 for ms in times["ms"].values())
        assert times["median_ratio"]["same-work"] == 1.0
        assert all(math.isfinite(r) and r > 0 for r in times["median_ratio"].values())


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("IMAGE_PYTHON"), reason="IMAGE_PYTHON: a Python with torchvision")
def test_batchnorm_bench_compares_two_ranks_with_one_process(tmp_path: Path) -> None:
    """python -m bench.batchnorm, tiny: float64 agrees to rounding; every figure is reported."""
    out = tmp_path / "batchnorm.json"
    cmd = [os.environ["IMAGE_PYTHON"], "-m", "bench.batchnorm", "--models", "resnet18", "--image-size", "16"]
    cmd += ["--batch", "4", "--steps", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["results"]["resnet18"]
    assert figures["float64"]["state_gap"][0] < 1e-10
    assert figures["float32"]["relu_inputs"] > 0 and "one_process_vs_float64" in figures["float32"]
