"""The image task: is the generated trainer as fast as torchvision DDP loops written by hand?

    python -m bench.image              # 3 interleaved rounds on JPEG, W=1 and 2 (CPU)
    python -m bench.image --quick      # 1 round, a few steps and images: a smoke run
    python -m bench.image --repeats 5 --formats jpeg,png
    python -m bench.image --device cuda --precision bf16 --image-size 224 --model resnet18 \
        --batch-size 128 --num-workers 8 --world-sizes 1 --formats jpeg   # bench/gpu.sh does

Renders a project with task=image from this repository's working tree, writes a folder of
generated pictures (8 classes; each picture a smooth colour field, a class stripe and noise,
--min-px to --max-px on a side) as JPEG and as PNG, and runs bench/image_loops.py's contenders
on it under torchrun (gloo on CPU), interleaved round after round: `reference-same-work`,
`examples-imagenet` and `generated` (the trainer with logging, evaluation and checkpoints out
of the timed window). Reports median images/s, medians of per-round ratios to
reference-same-work, and where each contender's window went (data wait, forward + backward,
the rest). Then the data loading alone: images/s per loader worker of the trainer's dataset
(images.py) and of torchvision's ImageFolder + transforms on the same files, at 1 and 2
workers, with and without the JPEG draft shortcut; the time per image of each stage; and the
trainer's own data_wait_frac from its metrics.jsonl (--num-workers as set, and 0). Last, one
epoch of the trainer as a user runs it, per world size, with a clock on each phase
(bench/image_phases.py): where the time outside the training steps and evaluations goes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .generated import REPO
from .harness import (
    PACKAGE,
    environment,
    fmt,
    git_state,
    median_or_none,
    pct,
    ratios,
    run_one,
    save_results,
    sps,
    stamp,
    torchrun,
    wait_quiet,
)
from .image_loops import CONTENDERS

BASE = "reference-same-work"


def render_image_project(dest: Path) -> float:
    """Render the working tree's template with task=image; the CLI runs in a Python with copier
    (this one, or the repository's .venv: the image venv may lack it)."""
    python = sys.executable
    if importlib.util.find_spec("copier") is None and (REPO / ".venv/bin/python").exists():
        python = str(REPO / ".venv/bin/python")
    with tempfile.TemporaryDirectory(prefix="bench-tpl-") as tpl:
        shutil.copy2(REPO / "copier.yml", tpl)
        shutil.copytree(REPO / "template", Path(tpl) / "template")
        cmd = [python, "-m", "generator", PACKAGE, "-y", "--template", tpl, "--dest", str(dest)]
        started = time.perf_counter()
        done = subprocess.run([*cmd, "--data", "task=image"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"rendering failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started


def write_images(root: Path, fmt_: str, classes: int, train: int, val: int, px: tuple[int, int]) -> None:
    """root/{train,val}/class_K/*.{jpg,png}: a smooth colour field, class K's stripe, noise."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for k in range(classes):
            folder = root / split / f"class_{k}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                h, w = (int(x) for x in rng.integers(px[0], px[1] + 1, size=2))
                field = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize(
                    (w, h), Image.BICUBIC
                )
                y, x = np.mgrid[0:h, 0:w]
                angle = np.pi * k / classes
                stripe = np.abs((x - w / 2) * np.sin(angle) - (y - h / 2) * np.cos(angle)) < min(h, w) / 8
                pixels = np.asarray(field, dtype=np.int16) + rng.integers(-24, 25, (h, w, 3))
                pixels[stripe] = (k * 97 % 256, k * 57 % 256, 255 - k * 31 % 256)
                image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
                if fmt_ == "jpeg":
                    image.save(folder / f"{i:04d}.jpg", quality=90)
                else:
                    image.save(folder / f"{i:04d}.png")


def contender_command(c: str, ws: int, a: argparse.Namespace, data: Path, out: Path, extra=()) -> list[str]:
    steps = a.warmup + a.timed + 1  # the last step (the trainer's final eval + checkpoint) untimed
    common = [
        f"--data-path={data}", f"--image-size={a.image_size}", f"--model={a.model}",
        f"--batch-size={a.batch_size}", f"--num-workers={a.num_workers}", "--seed=0",
        f"--device={a.device}", f"--precision={a.precision}", f"--max-steps={steps}",
    ]  # fmt: skip
    mine = [f"--contender={c}", f"--warmup={a.warmup}", f"--timed={a.timed}", f"--package={PACKAGE}"]
    mine += [
        f"--prefetch-factor={a.prefetch}",
        "--channels-last" if a.channels_last else "--no-channels-last",
    ]
    if c != "generated":
        return torchrun(ws, "bench.image_loops", [*mine, *common])
    trainer = [
        *common, f"--prefetch-factor={a.prefetch}", "--resume=never", "--log-every=1000000000",
        "--eval-every=0", "--ckpt-every=0", "--ckpt-every-minutes=0", "--grad-accum-steps=1",
        "--channels-last" if a.channels_last else "--no-channels-last", *extra,
    ]  # fmt: skip
    mine += [f"--batch-size={a.batch_size}", f"--out-dir={out}"]  # the global batch of the clock
    return torchrun(ws, "bench.image_loops", [*mine, "--", *trainer])


def run_rounds(
    a: argparse.Namespace, folders: dict[str, Path], env: dict[str, str], work: Path
) -> list[dict]:
    """Interleaved: each round, each format, each world size, each contender."""
    runs = []
    for rnd in range(a.repeats):
        for fmt_, data in folders.items():
            for ws in a.world_sizes:
                for c in CONTENDERS:
                    out = work / f"run-{rnd}-{fmt_}-{ws}-{c}"
                    waited = wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else 0.0
                    record = run_one(contender_command(c, ws, a, data, out), env, a.timeout)
                    record.update(round=rnd, format=fmt_, world_size=ws, contender=c, waited_s=waited)
                    runs.append(record)
                    shutil.rmtree(out, ignore_errors=True)
                    problem = "  " + record["error"] if "error" in record else ""
                    print(
                        f"round {rnd + 1}/{a.repeats} {fmt_:<4} W={ws} {c:<20}"
                        f"{fmt(record.get('samples_per_sec'), ',.1f'):>8} images/s"
                        f"  ({record.get('wall_s', 0):.1f} s,"
                        f" other load {fmt(pct(record.get('foreign_cpu')), '.0f')}%){problem}",
                        flush=True,
                    )
    return runs


def summarize(runs: list[dict], formats: list[str], world_sizes: list[int]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for fmt_ in formats:
        of = [r for r in runs if r["format"] == fmt_]
        rounds = sorted({r["round"] for r in of})
        for ws in world_sizes:
            rows = {}
            for c in CONTENDERS:
                values = [v for v in (sps(of, c, ws, rnd) for rnd in rounds) if v]
                cpu = [v for v in (sps(of, c, ws, rnd, "cpu_samples_per_sec") for rnd in rounds) if v]
                done = [r for r in of if (r["contender"], r["world_size"]) == (c, ws) and "error" not in r]
                split = {}
                for key in ("data_s", "compute_s", "other_s"):
                    shares = [r[key] / r["window_s"] for r in done if key in r]
                    split[key.replace("_s", "_share")] = median_or_none(shares)
                rows[c] = {
                    "median_images_per_sec": median_or_none(values),
                    "images_per_sec": values,
                    "median_ratio_to_reference": median_or_none(ratios(of, c, BASE, ws)),
                    # Per rank-0 CPU second: steadier when other processes share the cores.
                    "median_cpu_images_per_sec": median_or_none(cpu),
                    "median_cpu_ratio_to_reference": median_or_none(
                        ratios(of, c, BASE, ws, "cpu_samples_per_sec")
                    ),
                    "ratios_to_reference": ratios(of, c, BASE, ws),
                    **split,
                    "foreign_cpu_median": median_or_none(
                        [r["foreign_cpu"] for r in done if "foreign_cpu" in r]
                    ),
                }
            table[f"{fmt_} W={ws}"] = rows
    return table


def loader_rates(a: argparse.Namespace, project: Path, folders: dict[str, Path]) -> list[dict[str, Any]]:
    """Images/s of the data loading alone (no model), per worker, trainer's dataset vs torchvision's."""
    import torch
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(project / "src"))
    from benchproj import data as project_data  # noqa: PLC0415 (the rendered package)
    from benchproj.engine.loading import collate
    from benchproj.task import TrainConfig
    from PIL import JpegImagePlugin

    from .image_loops import image_folder

    out = []
    for fmt_, folder in folders.items():
        cfg = TrainConfig(data_path=str(folder), image_size=a.image_size)
        ours = project_data.build_datasets(cfg)[0]
        theirs = image_folder(argparse.Namespace(data_path=folder, image_size=a.image_size))
        pipelines = {"trainer (images.py)": (ours, collate), "torchvision ImageFolder": (theirs, None)}
        if fmt_.startswith("jpeg"):
            pipelines["trainer, no JPEG draft"] = (ours, collate)
        for name, (dataset, coll) in pipelines.items():
            draft = JpegImagePlugin.JpegImageFile.draft
            if "no JPEG draft" in name:  # workers fork after this: they decode at full size
                JpegImagePlugin.JpegImageFile.draft = lambda self, mode, size: None
            try:
                for workers in a.loader_workers:
                    loader = DataLoader(
                        dataset, batch_size=a.batch_size, shuffle=True, num_workers=workers,
                        collate_fn=coll, prefetch_factor=2 if workers else None,
                        generator=torch.Generator().manual_seed(0),
                    )  # fmt: skip
                    it = iter(loader)
                    next(it)  # the workers are up
                    count, started = 0, time.perf_counter()
                    for _ in range(min(a.loader_batches, len(loader) - 1)):
                        count += len(next(it)[1])
                    rate = count / (time.perf_counter() - started)
                    del it, loader
                    out.append({"format": fmt_, "pipeline": name, "workers": workers, "images_per_sec": rate,
                                "per_worker": rate / max(1, workers)})  # fmt: skip
                    print(f"loader {fmt_:<10} {name:<26} workers {workers}: {rate:7.0f} images/s,"
                          f" {rate / max(1, workers):6.0f} per worker", flush=True)  # fmt: skip
            finally:
                JpegImagePlugin.JpegImageFile.draft = draft
    return out


def stage_times(a: argparse.Namespace, project: Path, folder: Path, n: int) -> dict[str, dict[str, float]]:
    """Microseconds per image of each stage, in this process on one thread: where decoding goes."""
    import torch
    from PIL import Image
    from torchvision import transforms

    sys.path.insert(0, str(project / "src"))
    from benchproj.engine import images

    torch.set_num_threads(1)
    files = sorted(folder.glob("train/*/*"))[:n]
    ours = {
        "decode (open + draft + RGB)": 0.0,
        "crop + resize": 0.0,
        "flip": 0.0,
        "to tensor + normalize": 0.0,
    }
    theirs = {"decode (open + RGB)": 0.0, "RandomResizedCrop": 0.0, "flip": 0.0, "ToTensor + Normalize": 0.0}
    crop, flip = transforms.RandomResizedCrop(a.image_size), transforms.RandomHorizontalFlip()
    tensor, norm = transforms.ToTensor(), transforms.Normalize(images.MEAN.flatten(), images.STD.flatten())
    g = torch.Generator().manual_seed(0)
    for path in files:
        t0 = time.perf_counter()
        with Image.open(path) as f:
            box = images.crop_box(*f.size, g)
            image, box = images.to_rgb(f, box, a.image_size)
        t1 = time.perf_counter()
        image = image.resize((a.image_size,) * 2, Image.Resampling.BILINEAR, box=box)
        t2 = time.perf_counter()
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        t3 = time.perf_counter()
        pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
        (pixels.float() / 255 - images.MEAN) / images.STD
        t4 = time.perf_counter()
        for key, dt in zip(ours, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            ours[key] += dt
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")  # torchvision's pil_loader
        t1 = time.perf_counter()
        image = crop(image)
        t2 = time.perf_counter()
        image = flip(image)
        t3 = time.perf_counter()
        norm(tensor(image))
        t4 = time.perf_counter()
        for key, dt in zip(theirs, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            theirs[key] += dt
    scale = 1e6 / len(files)
    return {
        "trainer (images.py)": {k: v * scale for k, v in ours.items()},
        "torchvision": {k: v * scale for k, v in theirs.items()},
    }


def data_wait_runs(a, folders, env, work) -> list[dict[str, Any]]:
    """The trainer's own data_wait_frac (metrics.jsonl, every step logged) at --num-workers as set and 0."""
    fmt_, data = next(iter(folders.items()))
    out = []
    for ws in a.world_sizes:
        for workers in sorted({a.num_workers, 0}, reverse=True):
            run_dir = work / f"wait-{ws}-{workers}"
            extra = ["--log-every=1", f"--num-workers={workers}"]
            cmd = contender_command("generated", ws, a, data, run_dir, extra)
            record = run_one(cmd, env, a.timeout)
            shutil.rmtree(run_dir, ignore_errors=True)
            row = {"format": fmt_, "world_size": ws, "num_workers": workers,
                   "images_per_sec": record.get("samples_per_sec"),
                   "trainer_data_wait_frac": record.get("self_data_wait_frac_median"),
                   "bench_data_share": record["data_s"] / record["window_s"] if "data_s" in record else None,
                   "error": record.get("error")}  # fmt: skip
            out.append(row)
            print(f"trainer {fmt_} W={ws} --num-workers {workers} (logging every step):"
                  f" {fmt(row['images_per_sec'], ',.1f')} images/s, data_wait_frac"
                  f" {fmt(pct(row['trainer_data_wait_frac']), '.1f')}%", flush=True)  # fmt: skip
    return out


# The phases of bench/image_phases.py in the order a run passes them, and what the report calls
# the time outside the training steps and the evaluations (start-up and exit).
PHASES = [
    "torchrun and the interpreter", "import torch", "import torchvision", "import the project",
    "prepare the data", "build the datasets", "find the start (resume)", "process group",
    "run lock", "settings file", "build the run (model, DDP, checks, loaders)", "steps",
    "evaluations", "checkpoint saves (the step's part)", "checkpoint waits (the write's rest)",
    "teardown (process group)",
]  # fmt: skip


def startup_runs(a, folders, env, work) -> list[dict[str, Any]]:
    """One epoch of the trainer as a user runs it (its own evaluation and checkpoint defaults)
    under bench/image_phases.py's clock, per world size: where the time outside the steps goes."""
    fmt_, data = next(iter(folders.items()))
    out = []
    for ws in a.world_sizes:
        run_dir = work / f"startup-{ws}"
        trainer = [
            f"--data-path={data}", f"--image-size={a.image_size}", f"--model={a.model}",
            f"--batch-size={a.batch_size}", f"--num-workers={a.num_workers}", "--seed=0",
            f"--device={a.device}", f"--precision={a.precision}", "--epochs=1",
            f"--out-dir={run_dir}", "--resume=never",
        ]  # fmt: skip
        cmd = torchrun(ws, "bench.image_phases", ["--package", PACKAGE, "--", *trainer])
        record = run_one(cmd, {**env, "BENCH_LAUNCHED": repr(time.time())}, a.timeout)
        shutil.rmtree(run_dir, ignore_errors=True)
        record.update(format=fmt_, world_size=ws)
        if "error" not in record and record["exit_status"] != 0:
            record["error"] = f"the trainer exited with status {record['exit_status']}"
        if "error" not in record:
            reached = record.get("exit handlers reached", record["main returned"])
            record["main's return to the exit handlers"] = reached - record["main returned"]
            record["exit handlers to torchrun's exit"] = record["wall_s"] - reached
            inside = record.get("steps", 0.0) + record.get("evaluations", 0.0)
            record["outside steps and evaluations"] = record["wall_s"] - inside
            record["imports to first step"] = record["first step done"] - record["imports done"]
            record["last save to exit"] = record["wall_s"] - record["last save done"]
        out.append(record)
        print_startup(record)
    return out


def print_startup(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"start-up run W={r['world_size']}: {r['error']}", flush=True)
        return
    steps = r["calls"].get("steps", 0)
    print(f"\none epoch, W={r['world_size']} ({steps} steps), {r['wall_s']:.1f} s from launch to exit;"
          f" outside the steps and evaluations {r['outside steps and evaluations']:.1f} s;"
          f" imports to the end of the first step {r['imports to first step']:.1f} s;"
          f" the last save to the exit {r['last save to exit']:.1f} s", flush=True)  # fmt: skip
    for phase in [*PHASES, "main's return to the exit handlers", "exit handlers to torchrun's exit"]:
        if phase in r:
            calls = r["calls"].get(phase, 1)
            print(f"  {phase:<46}{r[phase]:>7.2f} s" + (f"  ({calls} calls)" if calls > 1 else ""))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round, few steps and images, JPEG loader only")
    p.add_argument("--repeats", type=int, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--world-sizes", default="1,2", help="comma-separated (default 1,2)")
    p.add_argument("--formats", default="jpeg", help="of the training rounds: jpeg,png (default jpeg)")
    p.add_argument(
        "--model", default="mobilenet_v3_small", help="torchvision model (default mobilenet_v3_small)"
    )
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16, help="per rank (default 16)")
    p.add_argument("--num-workers", type=int, default=1, help="loader workers per rank (default 1)")
    p.add_argument("--prefetch", type=int, default=2, help="batches per worker ahead (the trainer's auto: 2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True, help="(CUDA)")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--train-per-class", type=int, help="training images per class (default 128)")
    p.add_argument("--min-px", type=int, default=96)
    p.add_argument("--max-px", type=int, default=160)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process (default 1)")
    p.add_argument("--warmup", type=int, help="untimed steps (default 3; 2 with --quick)")
    p.add_argument("--timed", type=int, help="timed steps (default 20; 3 with --quick)")
    p.add_argument("--loader-workers", default="1,2", help="worker counts of the loader-only runs")
    p.add_argument("--no-loader", action="store_true", help="skip the data-loading breakdown")
    p.add_argument("--no-startup", action="store_true", help="skip the one-epoch start-up/exit runs")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S", help="wait <= S s for idle cores")
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--json", type=Path, help="results file (default bench/results/image-DATE.json)")
    return p


def print_report(result: dict[str, Any]) -> None:
    print(f"\nImages/s (global, wall clock): median of {result['repeats']} interleaved rounds;"
          f" x ref: median of per-round ratios to {BASE}. Shares of the timed window: data wait,"
          " forward+backward, the rest.")  # fmt: skip
    print(f"{'':<12}{'contender':<21}{'images/s':>9}{'x ref':>7}{'data':>7}{'fwd+bwd':>9}{'rest':>7}")
    for key, rows in result["summary"].items():
        for c, row in rows.items():
            print(f"{key:<12}{c:<21}{fmt(row['median_images_per_sec'], ',.1f'):>9}"
                  f"{fmt(row['median_ratio_to_reference'], '.3f'):>7}{fmt(pct(row['data_share']), '.1f'):>6}%"
                  f"{fmt(pct(row['compute_share']), '.1f'):>8}%"
                  f"{fmt(pct(row['other_share']), '.1f'):>6}%")  # fmt: skip
    for what, stages in result.get("stages_us", {}).items():
        print(f"\nper image, one thread, {what}: " + ", ".join(f"{k} {v:.0f} us" for k, v in stages.items()))
    for r in result["runs"]:
        if "error" in r:
            print(
                f"note: round {r['round'] + 1} {r['format']} W={r['world_size']}"
                f" {r['contender']}: {r['error']}"
            )


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if importlib.util.find_spec("torchvision") is None:
        print("error: python -m bench.image needs torchvision in this Python", file=sys.stderr)
        return 2
    a.repeats = a.repeats or (1 if a.quick else 3)
    a.warmup = a.warmup or (2 if a.quick else 3)
    a.timed = a.timed or (3 if a.quick else 20)
    a.world_sizes = [int(x) for x in a.world_sizes.split(",")]
    a.loader_workers = [int(x) for x in a.loader_workers.split(",")]
    a.loader_batches = 8 if a.quick else 40
    formats = a.formats.split(",")
    per_class = a.train_per_class or (16 if a.quick else 128)
    work = Path(tempfile.mkdtemp(prefix="ddp-bench-image-"))
    started, git = time.time(), git_state()
    try:
        project = work / "project"
        print(
            f"rendered the working tree's template (task=image) in {render_image_project(project):.1f} s",
            flush=True,
        )
        folders = {}
        for fmt_ in sorted({*formats, *([] if a.quick else ["jpeg", "png"])}):  # rounds; loader: both
            folders[fmt_] = work / f"images-{fmt_}"
            write_images(
                folders[fmt_], fmt_, a.classes, per_class, max(2, per_class // 8), (a.min_px, a.max_px)
            )
        env = environment(a.threads, project)
        load_before = os.getloadavg()
        runs = run_rounds(a, {f: folders[f] for f in formats}, env, work)
        loader, stages, waits, startup = [], {}, [], []
        if not a.no_loader:
            if not a.quick:  # ImageNet-sized photos: where draft decoding pays
                folders["jpeg-large"] = work / "images-jpeg-large"
                write_images(folders["jpeg-large"], "jpeg", a.classes, 32, 2, (375, 500))
            loader = loader_rates(a, project, folders)
            for fmt_, folder in folders.items():
                for what, times in stage_times(a, project, folder, 32 if a.quick else 200).items():
                    stages[f"{fmt_}, {what}"] = times
            if not a.quick:
                waits = data_wait_runs(a, {formats[0]: folders[formats[0]]}, env, work)
        if not a.no_startup:
            startup = startup_runs(a, {formats[0]: folders[formats[0]]}, env, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        **stamp("python -m bench.image", argv),
        "duration_s": time.time() - started,
        "repeats": a.repeats,
        "world_sizes": a.world_sizes,
        "formats": formats,
        "threads_per_process": a.threads,
        "workload": {
            "model": a.model,
            "image_size": a.image_size,
            "batch_size_per_rank": a.batch_size,
            "num_workers": a.num_workers,
            "prefetch_factor": a.prefetch,
            "device": a.device,
            "precision": a.precision,
            "channels_last": a.channels_last,
            "classes": a.classes,
            "train_images": a.classes * per_class,
            "px": [a.min_px, a.max_px],
            "warmup": a.warmup,
            "timed": a.timed,
        },  # fmt: skip
        "contenders": list(CONTENDERS),
        "machine": {"cpus": os.cpu_count(), "load_avg_before": load_before},
        "git": git,
        "summary": summarize(runs, formats, a.world_sizes),
        "loader": loader,
        "stages_us": stages,
        "trainer_data_wait": waits,
        "startup_phases": PHASES,
        "startup": startup,
        "runs": runs,
    }
    path = save_results("image", result, a.json)
    print_report(result)
    print(f"\nresults: {path}  ({result['duration_s'] / 60:.1f} min)")
    return 1 if any("error" in r for r in [*runs, *startup]) else 0


if __name__ == "__main__":
    sys.exit(main())
