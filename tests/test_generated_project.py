"""Generate projects and run them: one process, torchrun with two gloo ranks, and their own tests."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, answers_of, python, render, run
from test_render import COMBINATIONS

from generator import prompts
from generator.questions import Question, load_questions


@pytest.fixture(scope="module")
def project(template_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render(template_dir, tmp_path_factory.mktemp("run") / "demo")


def check_run(out_dir: Path, steps: int) -> list[dict]:
    """metrics.jsonl exists with finite losses up to `steps`, and the last step was checkpointed."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train and train[-1]["step"] == steps
    for record in train:
        assert math.isfinite(record["loss"]) and record["samples_per_sec"] > 0
        assert {"step", "loss", "lr", "samples_per_sec"} <= set(record)
    assert (out_dir / "checkpoints" / f"step_{steps:08d}.pt").is_file()
    return train


@pytest.mark.slow
def test_one_process(project: Path, tmp_path: Path) -> None:
    package = answers_of(project)["package_name"]
    proc = run(python("-m", f"{package}.train", "--max-steps", "5", "--out-dir", tmp_path), cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_run(tmp_path, 5)


@pytest.mark.slow
def test_torchrun_two_processes(project: Path, tmp_path: Path) -> None:
    package = answers_of(project)["package_name"]
    cmd = python(
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", f"{package}.train", "--max-steps", "5", "--out-dir", tmp_path,
    )  # fmt: skip
    proc = run(cmd, cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_run(tmp_path, 5)


# The generated suite for answers that together take every value of every question that changes
# what the suite runs (answer_values below checks them against copier.yml):
# each precision, accumulation 1, 2 and 3 (the suite's own tests must not assume 1 or 2), each
# logger, each launcher and none, both tasks (the image task: its own row below), the lean core
# (no features), every capability alone and all of them together (fsdp as the default strategy).
ALL_FEATURES = ["fsdp", "comm_hooks", "tools", "profiler"]
LEAN = dict(precision="bf16", logger="wandb")
SUITE_MATRIX = {
    "lean-bf16-accum1-all-launchers-wandb": LEAN,
    "all-features-fsdp-fp16-accum2-local": dict(
        features=ALL_FEATURES, strategy="fsdp", precision="fp16", grad_accum_steps=2, launchers=["local"]
    ),
    "comm-hooks-alone-fp16-accum3-tensorboard-no-launchers": dict(
        features=["comm_hooks"], precision="fp16", grad_accum_steps=3, logger="tensorboard", launchers=[]
    ),
    "fsdp-alone-fp32-accum2-slurm-kubernetes-mlflow": dict(
        features=["fsdp"], strategy="fsdp", precision="fp32", grad_accum_steps=2,
        launchers=["slurm", "kubernetes"], logger="mlflow",
    ),
    "lm-bf16-accum2-local-tools-profiler": dict(
        task="lm", precision="bf16", grad_accum_steps=2, launchers=["local"], features=["tools", "profiler"]
    ),
    "tools-alone": dict(features=["tools"], launchers=["local"]),
    "profiler-alone": dict(features=["profiler"], launchers=["local"]),
}  # fmt: skip
# What a row runs follows from what its answers change (the diffs of single-answer renders:
# docs/maintaining.md, "The test rows"). The engine imports nothing of the task's, and tests/tiny.toml
# fixes the precision, so most tests run the same code whatever the answers; such a test runs once,
# in the lean core's row, which runs its whole suite as its README does (pytest -n 2). A row whose
# answers change the training itself (a task, fsdp, comm hooks, accumulation) runs the quick
# tests (-m "not slow") of its whole suite, and whole the files its answers change: the fsdp
# default's checkpoints and resume; DDP == one process at fp16 and accumulation 3; the
# tracking loggers and the Kubernetes launcher; a task's own tests and TASK_TESTS. A row whose
# answers add only files of their own (tools, the profiler) runs those files and the ones they
# change; test_rows_run_the_test_files_their_answers_change checks that against the renders.
# ruff and the answers that change only text (license, python_version, include_ci):
# tests/test_render.py.
WHOLE = {"lean-bf16-accum1-all-launchers-wandb"}  # rows that run their whole suite
OWN_FILES_ONLY = {"tools-alone", "profiler-alone"}  # rows without the quick tests of the rest
# The tests whose outcome depends on the task's model, data, loss and metrics, beyond the quick
# ones: N ranks == one process, evaluation, exact resume (keyed randomness and another world size
# too). Whatever else the engine does (signals, locks, launchers, timeouts) it does alike for any
# task: proven once, on the classifier, in the lean row.
DDP_TESTS = [
    "tests/test_distributed.py::test_two_ranks_equal_one_process_with_the_same_global_batch",
    "tests/test_distributed.py::test_replicas_are_bitwise_identical",
    "tests/test_distributed.py::test_metrics_and_checkpoints",
    "tests/test_distributed.py::test_resume_mid_epoch_is_exact",
    "tests/test_distributed.py::test_two_rank_evaluation_equals_one_process",
]  # test_distributed.py's other tests: signals, the engine's alike for any task or hook
TASK_TESTS = [
    *DDP_TESTS, "tests/test_randomness.py", "tests/test_resume.py",
    "tests/test_faults.py::test_resume_on_another_world_size_with_the_same_global_batch",
]  # fmt: skip
# The engine's own quick tests: the run lock, the launch scripts, ranks that cannot meet, a
# process refused before it starts (WORLD_SIZE without torchrun, a bad flag: engine/dist.py,
# options.py, cli.py), the tests' own children's signal handling (conftest.py). No task,
# feature, precision or accumulation changes their code or their tests
# (test_a_task_changes_none_of_the_engine, test_no_answer_changes_the_engine_tests_code), so
# every row but the lean one leaves them to it, like the engine's slow tests; they still read
# the row's tiny settings and train, which the row's own quick tests prove.
ENGINE_TESTS = [
    "tests/test_lock.py", "tests/test_launch_scripts.py",
    "tests/test_errors.py::test_ranks_that_cannot_meet_stop_with_one_line",
    "tests/test_config.py::test_a_world_size_without_torchrun_is_refused_at_once",
    "tests/test_config.py::test_command_line_error_has_no_traceback",
    "tests/test_faults.py::test_the_processes_tests_start_handle_signals_that_pytest_ignores",
]  # fmt: skip
ENGINE_TESTS_CODE = [
    "engine/lock.py", "engine/runlock.py", "engine/rendezvous.py", "engine/preemption.py",
    "engine/dist.py", "engine/options.py", "engine/cli.py",
]  # fmt: skip
# conftest.py's fixture that the signal test checks: the same in every row.
ENGINE_FIXTURES = ["tests/conftest.py::children_get_default_signal_handling"]
SUITE_SELECTION = {
    "lean-bf16-accum1-all-launchers-wandb": ["--numprocesses=2"],  # its README's command
    "all-features-fsdp-fp16-accum2-local": [
        "tests/test_checkpoint.py", "tests/test_resume.py",
        "tests/test_train.py::test_compile_trains_as_without_it",  # over FSDP2
    ],
    "comm-hooks-alone-fp16-accum3-tensorboard-no-launchers": [
        "tests/test_config.py", "tests/test_comm_hooks.py", *DDP_TESTS,
    ],
    "fsdp-alone-fp32-accum2-slurm-kubernetes-mlflow": [
        "tests/test_tracking.py", "tests/test_kubernetes.py", "tests/test_fsdp.py",
    ],
    "lm-bf16-accum2-local-tools-profiler": [
        "tests/test_lm.py", "tests/test_hf.py", "tests/test_tools.py", *TASK_TESTS,
    ],
    "tools-alone": ["tests/test_tools.py", "tests/test_plot.py"],
    "profiler-alone": ["tests/test_profiler.py", "tests/test_config.py", "tests/test_train.py"],
}  # fmt: skip


def runs_quick(row: str) -> bool:
    """Whether a row runs the quick tests of the files it does not select as well."""
    return row not in WHOLE and row not in OWN_FILES_ONLY


def left_out(row: str) -> list[str]:
    """The quick tests a row leaves to the lean row: the engine's."""
    return [] if row in WHOLE else ENGINE_TESTS


def suite_commands(
    interpreter: str, selection: list[str], quick: bool, leave_out: list[str] = ()
) -> list[list[str]]:
    """The pytest runs of a row: the quick tests of every file and test but the selected ones
    and `leave_out` (when `quick`), then the selection."""
    pytest_ = [interpreter, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
    chosen = [item for item in [*selection, *leave_out] if not item.startswith("-")]
    skip = [f"--deselect={item}" if "::" in item else f"--ignore={item}" for item in chosen]
    commands = [[*pytest_, "-m", "not slow", *skip]] if quick else []
    return [*commands, [*pytest_, *selection]]


def durations(output: str) -> str:
    """The "slowest durations" table of a pytest run's output, or nothing."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line), None)
    if start is None:
        return ""
    table = [line for line in lines[start + 1 :] if re.match(r"\d+\.\d+s ", line)]
    return "\n".join(table)


def run_suite(
    interpreter: str,
    project: Path,
    selection: list[str],
    quick: bool = True,
    leave_out: list[str] = (),
) -> list[str]:
    """Run a row's tests in `project`; assert each run passed; return their outputs."""
    outputs = []
    for command in suite_commands(interpreter, selection, quick, leave_out):
        start = time.monotonic()
        proc = run(command, cwd=project, timeout=2400)  # test_faults.py took over 1200 s under load
        print(f"{' '.join(command[7:])}: {time.monotonic() - start:.0f} s")  # what each part costs
        print(durations(proc.stdout))  # under PYTEST_ADDOPTS=--durations=N; -rP shows the prints
        tail = proc.stdout[-6000:] + "\n--- stderr ---\n" + proc.stderr[-2000:]  # the summary, then logs
        assert proc.returncode == 0, f"{' '.join(command[1:])}\n{tail}"
        assert " passed" in proc.stdout and "no tests ran" not in proc.stdout, tail
        outputs.append(proc.stdout)
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("row", list(SUITE_MATRIX))
def test_generated_test_suite_passes(template_dir: Path, tmp_path: Path, row: str) -> None:
    project = render(template_dir, tmp_path / "suite", **SUITE_MATRIX[row])
    run_suite(sys.executable, project, SUITE_SELECTION[row], runs_quick(row), left_out(row))


def test_rows_run_the_test_files_their_answers_change(template_dir: Path, tmp_path: Path) -> None:
    """A row without the quick tests of the rest runs every test file that its features add to
    the suite of the same answers without them, or change in it."""
    for row in sorted(OWN_FILES_ONLY):
        (tmp_path / row).mkdir()
        (tmp_path / f"{row}-base").mkdir()
        project = render(template_dir, tmp_path / row / "demo", **SUITE_MATRIX[row])
        base = render(
            template_dir, tmp_path / f"{row}-base" / "demo", **{**SUITE_MATRIX[row], "features": []}
        )
        changed = {
            f"tests/{path.name}"
            for path in (project / "tests").glob("test_*.py")
            if not (base / "tests" / path.name).is_file()
            or path.read_text() != (base / "tests" / path.name).read_text()
        }
        assert changed <= set(SUITE_SELECTION[row]), (row, changed - set(SUITE_SELECTION[row]))


def test_a_task_changes_none_of_the_engine(template_dir: Path, tmp_path: Path) -> None:
    """What the task rows leave to the lean row (ENGINE_TESTS) runs the same code whatever the
    task: the engine's modules that two tasks both have, train.py, step.py and the launch scripts
    are the same files; a task adds data modules of its own (the image folders, the tokenizer)."""
    renders = {}
    for task in ("classifier", "lm", "image"):
        (tmp_path / task).mkdir()
        renders[task] = render(template_dir, tmp_path / task / "demo", task=task, launchers=["local"])
    owners = {"task.py", "model.py", "data.py"}
    base = renders.pop("classifier")
    for task, project in renders.items():
        for folder in ("src/demo", "src/demo/engine", "scripts"):
            names = [{p.name for p in (root / folder).iterdir() if p.is_file()} for root in (base, project)]
            shared = (names[0] & names[1]) - owners
            assert shared & {"train.py", "step.py", "runlock.py", "launch.py", "train_local.sh"}
            differ = [
                n
                for n in sorted(shared)
                if (base / folder / n).read_bytes() != (project / folder / n).read_bytes()
            ]
            assert differ == [], (task, folder, differ)


def test_no_answer_changes_the_engine_tests_code(template_dir: Path, tmp_path: Path) -> None:
    """What every row but the lean one leaves to it (ENGINE_TESTS) tests the same code in each
    row's answers: the lock, the rendezvous, the signals', the launch checks' and the options'
    modules and the launch scripts the row has are the lean row's, and so are conftest.py's
    signal fixture and the single tests of ENGINE_TESTS; in the classifier's rows, so are
    test_lock.py and test_launch_scripts.py (another task gives them its own data and model
    settings: test_a_task_changes_none_of_the_engine)."""
    (tmp_path / "lean").mkdir()
    lean = render(template_dir, tmp_path / "lean" / "demo", **SUITE_MATRIX[next(iter(WHOLE))])

    def functions(project: Path) -> list[str]:
        """The source of each single test of ENGINE_TESTS and of ENGINE_FIXTURES."""
        sources = []
        for item in [*ENGINE_TESTS, *ENGINE_FIXTURES]:
            if "::" in item:
                path, name = item.split("::")
                tree = ast.parse((project / path).read_text())
                sources += [next(ast.unparse(f) for f in tree.body if getattr(f, "name", "") == name)]
        return sources

    lean_functions = functions(lean)
    rows = {row: answers for row, answers in SUITE_MATRIX.items() if row not in WHOLE}
    for row, answers in {**rows, "image": IMAGE_ANSWERS}.items():
        (tmp_path / row).mkdir()
        project = render(template_dir, tmp_path / row / "demo", **answers)
        classifier = answers.get("task", "classifier") == "classifier"
        files = [f"src/demo/{path}" for path in ENGINE_TESTS_CODE]
        files += [f"scripts/{script.name}" for script in (project / "scripts").glob("*")]
        files += ENGINE_TESTS[:2] if classifier else []
        present = [f for f in files if (project / f).is_file()]
        differ = [f for f in present if (project / f).read_bytes() != (lean / f).read_bytes()]
        assert differ == [], (row, differ)
        assert functions(project) == lean_functions, row


# The image task needs torchvision, which must match torch's release: .ci/run makes a venv with
# both (IMAGE_PYTHON); without one, this row is skipped. It takes fsdp and comm hooks, which
# interact with BatchNorm over all ranks (sharded weights, compressed gradients); --strategy
# stays ddp, so TASK_TESTS run as in the other task rows.
IMAGE_PYTHON = os.environ.get("IMAGE_PYTHON", "")
IMAGE_ANSWERS = dict(task="image", launchers=["local"], features=["fsdp", "comm_hooks"])
IMAGE_TESTS = ["tests/test_images.py", "tests/test_batchnorm.py", *TASK_TESTS]
IMAGE_TESTS += ["tests/test_fsdp.py", "tests/test_comm_hooks.py"]
# test_fsdp.py's damaged and incomplete sharded checkpoints: files the engine refuses whatever
# the model (its checkpoint.py and loading.py), left to the fsdp rows.
IMAGE_TESTS += [
    "--deselect=tests/test_fsdp.py::test_an_incomplete_sharded_checkpoint_is_never_resumed",
    "--deselect=tests/test_fsdp.py::test_a_sharded_checkpoint_with_a_damaged_shard_file_is_skipped",
]


@pytest.mark.slow
@pytest.mark.skipif(not IMAGE_PYTHON, reason="IMAGE_PYTHON: a Python with torch and torchvision")
def test_image_project_suite_passes(template_dir: Path, tmp_path: Path) -> None:
    project = render(template_dir, tmp_path / "images", **IMAGE_ANSWERS)
    outputs = run_suite(IMAGE_PYTHON, project, IMAGE_TESTS, leave_out=ENGINE_TESTS)
    skipped = [line for out in outputs for line in out.splitlines() if line.startswith("SKIPPED")]
    assert not any("test_images" in s for s in skipped), skipped


# ---------------------------------------------------------------- every answer value in a row
# Questions whose answers change only text (LICENSE, pyproject.toml, ruff's target version, the
# CI workflow), never what a test runs: tests/test_render.py renders and lints each value.
TEXT_ONLY = {"license", "python_version", "include_ci"}
# An integer question's values that a row must take: the least, and one that divides no batch.
INT_VALUES = {"grad_accum_steps": [1, 2, 3]}


def answer_values(question: Question) -> list:
    """The values of a question that the rows must take: each choice (and none of a multiple
    choice), yes and no, INT_VALUES; none for free text (a name, a year)."""
    if question.type == "bool":
        return [True, False]
    if question.type == "int":
        return INT_VALUES[question.key]  # a new integer question: say which values prove it
    if question.multiselect:
        return [*question.choices, []]
    return list(question.choices)


def takes(answers: dict, key: str, value: object) -> bool:
    """Whether `answers` give `key` the value `value` (one of a multiple choice's items)."""
    answer = answers.get(key)
    if isinstance(answer, list) and value != []:
        return value in answer
    return answer == value


def test_every_answer_value_has_a_green_suite_in_ci() -> None:
    """Each value of each question that changes what the suite runs is some row's answer (with
    the defaults for what the row leaves out), so CI runs that row's suite, its quick tests at
    least; each value that changes only text is rendered and linted by tests/test_render.py."""
    questions = load_questions(REPO)
    with prompts.new_destination() as dst:
        rows = {
            name: prompts.complete(questions, given, {}, dst)
            for name, given in [*SUITE_MATRIX.items(), ("image", IMAGE_ANSWERS)]
        }
        renders = [prompts.complete(questions, given, {}, dst) for given in COMBINATIONS.values()]
    assert set(SUITE_SELECTION) == set(SUITE_MATRIX) and WHOLE <= set(SUITE_MATRIX)
    assert TEXT_ONLY <= set(questions)
    missing = [
        f"{key}={value!r}"
        for key, question in questions.items()
        for value in answer_values(question)
        if not any(takes(answers, key, value) for answers in (renders if key in TEXT_ONLY else rows.values()))
    ]
    assert missing == [], "no CI row takes these answers: add them to SUITE_MATRIX (or COMBINATIONS)"
