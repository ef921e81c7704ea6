"""Render every answer choice at least once and check the project is complete, clean and lint-free."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO, answers_of, cli, render
from packaging.requirements import Requirement

from generator import stdlib_names
from generator.errors import GeneratorError
from generator.prompts import render as render_jinja
from generator.questions import check_package_name, load_questions

ALL_FEATURES = ["fsdp", "comm_hooks", "tools", "profiler"]
# Together these renders take every value of every choice question at least once, and each
# optional capability (the features question) alone, with others, and not at all.
COMBINATIONS = {
    "defaults": {},
    "fp16-apache-312-local-tb": dict(
        precision="fp16", license="Apache-2.0", python_version="3.12", launchers=["local"],
        logger="tensorboard", include_ci=False, grad_accum_steps=3,
    ),
    "fp32-bsd-313-cluster-wandb": dict(
        precision="fp32", license="BSD-3-Clause", python_version="3.13",
        launchers=["multinode", "slurm", "kubernetes"], logger="wandb",
    ),
    "proprietary-slurm-only-mlflow": dict(
        license="Proprietary", launchers=["slurm"], package_name="custom_pkg", logger="mlflow",
    ),
    "no-launchers": dict(launchers=[], logger="tensorboard", precision="fp32"),
    "lm-fp16-local-tb": dict(
        task="lm", precision="fp16", launchers=["local"], logger="tensorboard", grad_accum_steps=3,
    ),
    "lm-fp32-cluster": dict(
        task="lm", precision="fp32", launchers=["multinode", "slurm", "kubernetes"], grad_accum_steps=2,
    ),
    "kubernetes-only": dict(launchers=["kubernetes"], package_name="kpkg", python_version="3.12"),
    "lm-bf16-no-launchers-no-ci": dict(task="lm", launchers=[], include_ci=False, package_name="gpt_pkg"),
    "fsdp-fp16-accum2": dict(
        features=["fsdp"], strategy="fsdp", precision="fp16", grad_accum_steps=2, launchers=["local"],
    ),
    "lm-all-features-fsdp-bf16": dict(
        task="lm", features=ALL_FEATURES, strategy="fsdp", precision="bf16", launchers=[],
        logger="tensorboard",
    ),
    "all-features-ddp": dict(features=ALL_FEATURES),
    "comm-hooks": dict(features=["comm_hooks"], precision="fp16"),
    "tools": dict(features=["tools"], launchers=["local"]),
    "lm-tools-profiler": dict(task="lm", features=["tools", "profiler"]),
    "image-fp16-local-tb": dict(
        task="image", precision="fp16", launchers=["local"], logger="tensorboard", grad_accum_steps=2,
    ),
    "image-all-features-fsdp-cluster": dict(
        task="image", features=ALL_FEATURES, strategy="fsdp", launchers=["multinode", "slurm", "kubernetes"],
        logger="mlflow",
    ),
    "quotes-and-backslashes": dict(
        description='Says "hi" \\n, a\ttab and \\', author_name="O'Brien \"Bob\" \\",
        author_email="o'b+x@ex-a.co.uk",
    ),
}  # fmt: skip

# Files (under src/PKG/) and words of one task that must not appear in a project of the other. The
# engine's settings and figures (optimizer knobs, --keep-best, --eval-batches, tok/s, MFU) are every task's.
TASK_ONLY = {
    "lm": (
        ["sample.py", "hf.py", "export.py", "engine/corpus.txt", "engine/tokenizer.py", "engine/sources.py",
         "engine/token_cache.py"],
        re.compile(r"cfg\.(n_layer|seq_len|d_model)|--(n-layer|seq-len|d-model)|\bGPT\b|perplexity|tokeniz"
                   r"|safetensors|hugging", re.IGNORECASE),
    ),
    "classifier": (
        ["engine/datafiles.py", "engine/formats.py"],
        re.compile(r"cfg\.(num_samples|input_dim|hidden_dim)|--(num-samples|input-dim|hidden-dim)|synthetic"),
    ),
    "image": (
        ["engine/images.py", "engine/syncbn.py", "sample_images.py"],
        re.compile(r"torchvision|syncbn|GlobalBatchNorm|sample_images|bad.images|image_size|--image-size"
                   r"|channels.last|pillow|\bPIL\b|images/s|img/s", re.IGNORECASE),
    ),
}  # fmt: skip

# What each optional capability adds: its files, and words found nowhere in a project without it
# (torch's own DDP comm-hook API, which a core test uses to count all-reduces, is not ours).
FEATURES = {
    "fsdp": (
        ["src/PKG/engine/fsdp.py", "tests/test_fsdp.py"],
        re.compile(r"fsdp|fully_shard|\.dcp\b|--strategy", re.IGNORECASE),
    ),
    "comm_hooks": (
        ["src/PKG/engine/comm_hooks.py", "tests/test_comm_hooks.py"],
        re.compile(r"(?<!register_)(?<!ddp_)comm.hook|powersgd", re.IGNORECASE),
    ),
    "tools": (
        ["src/PKG/tools/__init__.py", "src/PKG/tools/doctor.py", "src/PKG/tools/doctor_checks.py",
         "src/PKG/tools/check_sync.py", "src/PKG/tools/plot.py", "tests/test_tools.py", "tests/test_plot.py"],
        re.compile(r"doctor|check_sync|\bplot\b|matplotlib", re.IGNORECASE),
    ),
    "profiler": (
        ["src/PKG/engine/profiling.py", "tests/test_profiler.py"],
        re.compile(r"profil", re.IGNORECASE),
    ),
}  # fmt: skip

UNRENDERED = re.compile(r"(?<!\$)\{\{|\{%|%\}")  # GitHub's ${{ expr }} is not Jinja


@pytest.fixture(scope="module", params=list(COMBINATIONS))
def project(request: pytest.FixtureRequest, template_dir: Path, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp(request.param) / "proj"
    return render(template_dir, dest, **COMBINATIONS[request.param])


def test_expected_files(project: Path) -> None:
    answers = answers_of(project)
    package = project / "src" / answers["package_name"]
    top = ("data", "model", "step", "train", "task")
    engine = ("config", "dist", "checkpoint", "state", "parallel", "loading", "hooks")
    for name in [f"{module}.py" for module in top] + [f"engine/{module}.py" for module in engine]:
        assert (package / name).is_file(), name
    assert not [path.name for path in package.glob("*.py") if path.stem in engine]
    for name in ("README.md", "pyproject.toml", ".copier-answers.yml", "tests"):
        assert (project / name).exists(), name
    scripts = {
        "local": "train_local.sh",
        "multinode": "train_multinode.sh",
        "slurm": "train_slurm.sbatch",
    }
    for launcher, script in scripts.items():
        assert (project / "scripts" / script).is_file() == (launcher in answers["launchers"]), script
    assert (project / ".github" / "workflows" / "ci.yml").is_file() == answers["include_ci"]
    assert (project / "LICENSE").is_file() == (answers["license"] != "Proprietary")
    if answers["license"] != "Proprietary":
        assert answers["author_name"] in (project / "LICENSE").read_text()


def test_a_project_holds_nothing_of_the_other_task(project: Path) -> None:
    answers = answers_of(project)
    package = project / "src" / answers["package_name"]
    assert (package / "engine" / "loading.py").is_file()  # the task-independent part
    for name in TASK_ONLY[answers["task"]][0]:
        assert (package / name).is_file(), name
    texts = [*package.rglob("*.py"), *project.glob("tests/*.py"), *project.glob("configs/*")]
    texts += [project / "README.md", *project.glob("docs/*.md"), project / "pyproject.toml"]
    for other in TASK_ONLY.keys() - {answers["task"]}:
        names, words = TASK_ONLY[other]
        for name in names:
            assert not (package / name).exists(), name
        for path in texts:
            found = words.search(path.read_text(encoding="utf-8"))
            assert found is None, f"{other} in {path}: {found.group()}"


def test_a_capability_is_whole_when_chosen_and_absent_when_not(project: Path) -> None:
    answers = answers_of(project)
    texts = {  # not Kubeflow's CRD in k8s/crd/, vendored: its fields (seccompProfile) are not ours
        path: path.read_text(encoding="utf-8")
        for path in project.rglob("*")
        if path.is_file() and not {".git", "crd"} & set(path.parts) and path.suffix != ".txt"
    }
    for feature, (files, words) in FEATURES.items():
        chosen = feature in answers["features"]
        for name in files:
            path = project / name.replace("PKG", answers["package_name"])
            assert path.is_file() == chosen, (feature, name)
        if not chosen:
            for path, text in texts.items():
                found = words.search(text)
                assert found is None, f"{feature} not chosen, but {path} says {found.group()!r}"


def test_no_unrendered_jinja(project: Path) -> None:
    for path in project.rglob("*"):
        if path.is_file():
            assert "{{" not in path.name and "{%" not in path.name, path
            text = path.read_text(encoding="utf-8")
            assert not UNRENDERED.search(text), f"{path}: {UNRENDERED.search(text).group()}"


def test_answers_reach_the_code(project: Path) -> None:
    answers = answers_of(project)
    config = (project / "src" / answers["package_name"] / "engine" / "config.py").read_text()
    assert f'"{answers["precision"]}"' in config
    if "fsdp" in answers["features"]:
        assert re.search(rf'strategy: str = option\(( *#.*)?\s*"{answers["strategy"]}"', config), config
    else:
        assert "strategy" not in answers and "strategy:" not in config
    assert re.search(rf"grad_accum_steps: int = (option\()?{answers['grad_accum_steps']}\b", config)
    pyproject = (project / "pyproject.toml").read_text()
    assert f'requires-python = ">={answers["python_version"]}"' in pyproject
    assert ("tensorboard" in pyproject) == (answers["logger"] == "tensorboard")
    # wandb and mlflow are optional extras of their own, with a tracking module and its tests.
    for logger, package in (("wandb", "wandb>="), ("mlflow", "mlflow-skinny>=")):
        assert (f"{logger} = [" in pyproject and package in pyproject) == (answers["logger"] == logger)
    tracking = project / "src" / answers["package_name"] / "engine" / "tracking.py"
    assert tracking.is_file() == (answers["logger"] in ("wandb", "mlflow"))
    assert (project / "tests" / "test_tracking.py").is_file() == tracking.is_file()


def test_pyproject_holds_the_answers(project: Path) -> None:
    answers = answers_of(project)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["description"] == answers["description"]
    assert meta["authors"] == [{"name": answers["author_name"], "email": answers["author_email"]}]


def test_ruff_check_and_format(project: Path) -> None:
    for cmd in (["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *cmd], cwd=project, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compileall(project: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "src", "tests"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shell_scripts_parse(project: Path) -> None:
    scripts = [*project.glob("scripts/*.sh"), *project.glob("scripts/*.sbatch")]
    for script in scripts:
        proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"
        assert script.read_text().startswith("#!"), script


def test_yaml_files_parse(project: Path) -> None:
    import yaml

    for path in [*project.rglob("*.yml"), *project.rglob("*.yaml")]:
        yaml.safe_load(path.read_text())


def test_generated_ci_runs_only_what_can_succeed(project: Path) -> None:
    """No job that installs ddp-new (no registry serves it) or hides its failure."""
    ci = project / ".github" / "workflows" / "ci.yml"
    if ci.is_file():
        text = ci.read_text()
        assert "pip install ddp-new" not in text and "continue-on-error" not in text


KUBERNETES = (
    ["Dockerfile", ".dockerignore", "k8s/trainjob.yaml", "k8s/pvc.yaml", "k8s/crd/refresh.py",
     "k8s/crd/trainer.kubeflow.org_trainjobs.yaml", "k8s/crd/LICENSE", "docs/kubernetes.md",
     "tests/test_kubernetes.py"],
    re.compile(r"kubeflow|kubectl|trainjob|docker|\bk8s\b|jsonschema", re.IGNORECASE),  # not "Kubernetes":
    # preemption.py names it among the senders of SIGTERM
)  # fmt: skip


def test_the_kubernetes_launcher_is_whole_when_chosen_and_absent_when_not(project: Path) -> None:
    launchers = answers_of(project)["launchers"]
    files, words = KUBERNETES
    for name in files:
        assert (project / name).is_file() == ("kubernetes" in launchers), name
    # The launch scripts, their folder and their tests only with a script launcher.
    scripts = [name for name in launchers if name != "kubernetes"]
    assert (project / "scripts").exists() == bool(scripts)
    assert (project / "tests" / "test_launch_scripts.py").exists() == bool(scripts)
    if "kubernetes" not in launchers:
        for path in project.rglob("*"):
            if path.is_file() and not {".git", "__pycache__"} & set(path.parts):
                found = words.search(path.read_text(encoding="utf-8"))
                assert found is None, f"{path}: {found.group()}"


def test_the_trainjob_name_is_a_dns_label_that_leaves_room_for_pod_names(
    template_dir: Path, tmp_path: Path
) -> None:
    import yaml

    # A project name with capitals, '.', '_' and 60 characters: no DNS label.
    project = render(template_dir, tmp_path / f"My.Trainer_Project-{'x' * 40}1", launchers=["kubernetes"])
    job = yaml.safe_load((project / "k8s" / "trainjob.yaml").read_text())
    name = job["metadata"]["name"]
    assert name == "my-trainer-project-xxxxxxxxxxxxxxxxxxxxx"
    claim = yaml.safe_load((project / "k8s" / "pvc.yaml").read_text())["metadata"]["name"]
    assert claim == f"{name}-shared"
    assert f"registry.example.com/{name}:0.1.0 ." in (project / "Dockerfile").read_text()


def installed_modules(requirements: list[str]) -> set[str]:
    """Top-level modules of the installed distributions `requirements` need, with their own needs."""
    found = {}
    for dist in metadata.distributions():
        found.setdefault(re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower(), dist)
    names, todo, seen = set(), list(requirements), set()
    while todo:
        req = Requirement(todo.pop())
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen or key not in found or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(key)
        todo += found[key].requires or []
        for file in found[key].files or []:
            top = file.parts[0]
            if len(file.parts) > 1 and not top.endswith((".dist-info", ".data")) or file.suffix == ".py":
                names.add(top.removesuffix(".py"))
    return names


def validator_refuses(name: str) -> bool:
    question = load_questions(REPO)["package_name"]
    return bool(render_jinja(question.validator, {"package_name": name}).strip())


def test_package_name_refuses_the_standard_library_and_the_projects_own_modules() -> None:
    """copier.yml (plain copier too) refuses the standard library's names, Python's start-up hooks
    and the project's own top-level modules and folders: a package so named would shadow them
    (or be shadowed). Names of installed packages: the CLI's check (test_cli.py)."""
    names = {n for n in sys.stdlib_module_names if re.fullmatch(r"[a-z][a-z0-9_]*", n)}
    names |= {"sitecustomize", "usercustomize", "tests", "test_anything_new"}
    for path in [*(REPO / "template").iterdir(), *(REPO / "template" / "tests").iterdir()]:
        name = re.sub(r"{%.*?%}", "", path.name).removesuffix(".jinja")
        if name.endswith(".py") or path.parent.name == "template" and path.is_dir():
            names.add(name.removesuffix(".py"))  # tests/helpers.py, scripts/, ...
    accepted = [n for n in sorted(names) if re.fullmatch(r"[a-z][a-z0-9_]*", n) and not validator_refuses(n)]
    assert accepted == []
    assert not any(validator_refuses(n) for n in ("demo", "testbed", "jsonish", "my_model"))


def test_the_standard_library_list_in_copier_yml_is_current() -> None:
    """`python -m generator.stdlib_names` wrote every standard library name of this Python, and
    running it again changes nothing."""
    text = (REPO / "copier.yml").read_text()
    assert set(stdlib_names.stdlib_names()) <= set(stdlib_names.listed_names(text))
    assert stdlib_names.rewrite(text) == text


def test_the_cli_refuses_every_module_the_projects_dependencies_install() -> None:
    """The installed dependencies of every extra and theirs (matplotlib imports pyparsing): the CLI
    refuses each of their top-level modules as a package name, as copier.yml cannot know them."""
    pyproject = (REPO / "template" / "pyproject.toml.jinja").read_text()
    requirements = re.findall(r'"([A-Za-z0-9_.-]+)>=', pyproject)
    assert {"torch", "matplotlib", "wandb", "mlflow-skinny", "pytest"} <= set(requirements)
    names = installed_modules(requirements)
    assert {"torch", "pyparsing", "numpy"} <= names  # the project's own dependencies are installed here
    accepted = []
    for name in sorted(names):
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or validator_refuses(name):
            continue
        try:
            check_package_name(name)
            accepted.append(name)
        except GeneratorError:
            pass
    assert accepted == []


def test_a_default_package_name_that_shadows_an_installed_module_is_refused(
    template_dir: Path, tmp_path: Path
) -> None:
    """`ddp-new numpy -y`: the package name comes from the project's name, not from --data."""
    result = cli("numpy", "--defaults", "--template", template_dir, "--dest", tmp_path / "numpy")
    assert result.exit_code == 2, result.output
    assert "package_name 'numpy' would shadow the module 'numpy'" in result.output
    assert not (tmp_path / "numpy").exists() and list(tmp_path.iterdir()) == []
