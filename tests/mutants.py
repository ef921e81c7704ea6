"""Deliberate bugs that the test suite must catch: each is applied to a fresh render (or to a
copy of this repository) and the tests named for it must fail, after passing without it.

    .venv/bin/python tests/mutants.py [--only NAME ...] [--list] [--rev REV]

Each mutant is one exact replacement of text in one file. Where that text is no longer there
the script stops, naming the mutant: update its text here when the code it mutates changes.
Exit status 0 only when every mutant was caught by its tests and those tests passed unmutated.
The image task's tests run with $IMAGE_PYTHON (default .venv-image/bin/python).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
IMAGE_PYTHON = os.environ.get("IMAGE_PYTHON", str(REPO / ".venv-image" / "bin" / "python"))
TIMEOUT_S = 1200  # a test selection that runs longer counts as neither passed nor caught


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    answers: tuple[str, ...] | None  # the render's answers (key=value); None: this repository
    path: str  # in the render ({package}: its package) or in the repository
    old: str
    new: str
    tests: tuple[str, ...]


PKG = "src/{package}"
MUTANTS = [
    Mutant(
        "no_set_epoch",
        "the DistributedSampler is not told the epoch: every epoch reads the same order",
        (),
        f"{PKG}/engine/loading.py",
        "        self.set_epoch(epoch)\n",
        "",
        ("tests/test_loading.py::test_each_epoch_has_a_new_order",),
    ),
    Mutant(
        "no_sync_on_last_micro_batch",
        "no_sync also on the last micro-batch: the gradients are never all-reduced",
        (),
        f"{PKG}/step.py",
        "sync = index == count - 1",
        "sync = False",
        ("tests/test_train.py::test_one_gradient_all_reduce_per_optimizer_step",),
    ),
    Mutant(
        "sampler_position_not_restored",
        "a mid-epoch resume restarts the epoch: the sampler is not given the saved position",
        (),
        f"{PKG}/engine/loading.py",
        "self.sampler.set_position(progress.epoch, progress.position)",
        "self.sampler.set_position(progress.epoch, 0)",
        ("tests/test_distributed.py::test_resume_mid_epoch_is_exact",),
    ),
    Mutant(
        "grad_scaler_skipped",
        "fp16: optimizer.step() directly instead of scaler.step(): overflowed updates are applied",
        ("precision=fp16",),
        f"{PKG}/step.py",
        "        scaler.step(optimizer)\n",
        "        optimizer.step()\n",
        ("tests/test_faults.py::test_fp16_overflow_on_one_rank_is_skipped_and_counted",),
    ),
    Mutant(
        "run_lock_not_released",
        "the run lock is not released at a normal exit",
        (),
        f"{PKG}/train.py",
        "            run_lock.release()\n            dist.cleanup(clean_exit=True)\n",
        "            dist.cleanup(clean_exit=True)\n",
        ("tests/test_lock.py::test_lock_is_held_while_training_and_removed_at_the_end",),
    ),
    Mutant(
        "bad_csv_cell_accepted",
        "a CSV cell that is no number (x, inf) is read as 0 instead of refused",
        (),
        f"{PKG}/engine/formats.py",
        """np.loadtxt(lines, delimiter=",", quotechar='"', ndmin=2, comments=None)""",
        """np.loadtxt(lines, delimiter=",", quotechar='"', ndmin=2, comments=None,"""
        """ converters=lambda cell: 0.0 if cell.strip().isalpha() else float(cell))""",
        ("tests/test_data_files.py::test_a_bad_file_is_one_line_and_nothing_is_trained",),
    ),
    Mutant(
        "keyed_dropout_keyed_by_rank",
        "keyed dropout's seed offset by the rank: 2 ranks draw other masks than 1 process",
        (),
        f"{PKG}/engine/keyed.py",
        "keys = sample_keys(seed, step, where)",
        "keys = sample_keys(seed + torch.distributed.get_rank(), step, where)",
        ("tests/test_randomness.py::test_with_random_draws_two_ranks_equal_one_process[4-4-0]",),
    ),
    Mutant(
        "unreadable_image_skipped_silently",
        "an image that cannot be decoded is skipped without a word, whatever --bad-images says",
        ("task=image",),
        f"{PKG}/engine/images.py",
        "                self.unreadable(path, err)\n                continue\n",
        "                continue\n",
        (
            "tests/test_images.py::test_an_unreadable_image_stops_the_run_with_its_name",
            "tests/test_images.py::test_bad_images_skip_counts_them_and_trains",
        ),
    ),
    Mutant(
        "update_drops_owner_edit",
        "ddp-new update deletes a file the owner edited that the new template drops (says it kept it)",
        None,
        "generator/update.py",
        '            git(project, "checkout", "HEAD", "--", path)\n',
        "",
        ("tests/test_update.py::test_a_changed_file_that_the_template_drops_is_kept_as_a_conflict",),
    ),
    Mutant(
        "k8s_field_misspelt",
        "the TrainJob's spec.trainer.numNodes misspelt numNode",
        ("launchers=kubernetes",),
        "k8s/trainjob.yaml",
        "    numNodes: 2\n",
        "    numNode: 2\n",
        ("tests/test_kubernetes.py::test_the_trainjob_is_valid_for_the_crd",),
    ),
]


class Stale(Exception):
    """A mutant's old text is not (exactly once) in its file."""


def template_copy(root: Path, rev: str | None) -> Path:
    """copier.yml and template/ of the working tree, or of commit `rev`, as a plain directory."""
    root.mkdir()
    if rev:
        archive = subprocess.run(
            ["git", "archive", rev, "copier.yml", "template"], cwd=REPO, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    else:
        shutil.copy2(REPO / "copier.yml", root / "copier.yml")
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(REPO / "template", root / "template", ignore=ignore)
    return root


def render(template: Path, dest: Path, answers: tuple[str, ...], home: Path) -> Path:
    """A project rendered by the ddp-new CLI with --defaults and `answers`."""
    dest.parent.mkdir(parents=True)
    data = [arg for answer in answers for arg in ("--data", answer)]
    cmd = [sys.executable, "-m", "generator", dest.name, "--defaults", "--template", template]
    cmd += ["--dest", dest, *data]
    env = {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"error: rendering with {list(answers)} failed:\n{result.stdout}{result.stderr}")
    return dest


def repo_copy(dest: Path) -> Path:
    """This repository's files without its git history, virtual environments and caches."""
    skip = shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".pytest_cache", ".ruff_cache", "dist")
    shutil.copytree(REPO, dest, ignore=skip, symlinks=True)
    return dest


def target(mutant: Mutant, root: Path) -> Path:
    package = "" if mutant.answers is None else yaml.safe_load((root / ".copier-answers.yml").read_text())
    return root / mutant.path.format(package=package and package["package_name"])


def apply(mutant: Mutant, root: Path, *, write: bool) -> None:
    """Replace the mutant's old text by its new one in `root` (write=False: only check it is there)."""
    path = target(mutant, root)
    text = path.read_text() if path.is_file() else ""
    found = text.count(mutant.old)
    if found != 1:
        where = f"{found} times" if path.is_file() else "no such file"
        moved = [
            p
            for p in root.rglob("*")
            if p.is_file() and p != path and ".git" not in p.parts and mutant.old in read(p)
        ]
        hint = f" (it is in {', '.join(str(p.relative_to(root)) for p in moved)})" if moved else ""
        raise Stale(
            f"mutant {mutant.name}: its old text is in {path.relative_to(root)} {where}{hint}: update it"
        )
    if write:
        path.write_text(text.replace(mutant.old, mutant.new))


def read(path: Path) -> str:
    try:
        return path.read_text()
    except (UnicodeDecodeError, OSError):
        return ""


def run_tests(mutant_or_set: tuple[str, ...], root: Path, answers: tuple[str, ...] | None) -> dict:
    """Run the tests in `root`: {"status", "failed" (ids), "summary", "seconds", "output"}."""
    python = IMAGE_PYTHON if answers is not None and "task=image" in answers else sys.executable
    cmd = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rfEs", *mutant_or_set]
    path = str(root) if answers is None else str(root / "src")
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    started = time.monotonic()
    try:
        result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        status, output = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as err:
        status, output = None, f"{err.stdout or ''}{err.stderr or ''}"
    seconds = time.monotonic() - started
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - (.*))?$", output, re.MULTILINE)
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", line)]
    summary = lines[-1].strip("= ") if lines else "(no summary)"
    return {"status": status, "failed": failed, "summary": summary, "seconds": seconds, "output": output}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("--rev", help="render the template of this commit (default: the working tree)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    unknown = set(args.only or ()) - names
    if unknown:
        parser.error(f"no mutant {', '.join(sorted(unknown))} (--list names them)")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            where = "this repository" if m.answers is None else f"render {' '.join(m.answers) or 'default'}"
            print(f"{m.name}: {m.bug}\n    {where}: {m.path}\n    " + "\n    ".join(m.tests))
        return 0

    work = Path(tempfile.mkdtemp(prefix="ddp-new-mutants."))
    try:
        return run_all(chosen, work, args.rev)
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run_all(chosen: list[Mutant], work: Path, rev: str | None) -> int:
    """Render each answer set once, check the targets pass there, then catch each mutant."""
    home, template = work / "home", template_copy(work / "template", rev)
    home.mkdir()
    sets = list(dict.fromkeys(m.answers for m in chosen))
    bases: dict[tuple[str, ...] | None, Path] = {}
    for index, answers in enumerate(sets):
        if answers is None:
            bases[answers] = repo_copy(work / "repo")
        else:
            bases[answers] = render(template, work / f"mutants_{index}" / "mutant_project", answers, home)
    stale = []
    for m in chosen:
        try:
            apply(m, bases[m.answers], write=False)
        except Stale as err:
            stale.append(f"error: {err}")
    if stale:
        print("\n".join(stale), file=sys.stderr)
        return 2

    ok = True
    for answers in sets:
        tests = tuple(dict.fromkeys(t for m in chosen if m.answers == answers for t in m.tests))
        result = run_tests(tests, bases[answers], answers)
        label = "this repository" if answers is None else f"render {' '.join(answers) or 'default'}"
        print(f"unmutated {label}: {result['summary']} ({result['seconds']:.0f} s)", flush=True)
        if result["status"] != 0 or "skipped" in result["summary"]:
            print(f"  the targets must pass, none skipped, for a catch to mean anything:\n{result['output']}")
            ok = False

    for m in chosen:
        copy = work / "mutated" / m.name
        shutil.copytree(bases[m.answers], copy, symlinks=True)
        apply(m, copy, write=True)
        result = run_tests(m.tests, copy, m.answers)
        seconds = f"{result['seconds']:.0f} s"
        if result["status"] == 1 and result["failed"]:
            test, why = result["failed"][0]
            print(f"caught  {m.name} ({seconds}) by {test}\n        {why[:160]}", flush=True)
        else:
            ok = False
            why = "timed out" if result["status"] is None else f"exit {result['status']}"
            print(f"MISSED  {m.name} ({seconds}, {why}): {result['summary']}", flush=True)
            if result["status"] not in (0, 1):
                print(result["output"][-3000:])
        shutil.rmtree(copy, ignore_errors=True)
    print("every mutant caught" if ok else "some mutant was not caught, or a target failed unmutated")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
