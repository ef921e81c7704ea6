"""Generated projects made their owners': the owner's files (task.py, model.py, data.py at the
package top) changed as the generated README's "Your own model and data" says, and nothing of the
engine's (engine/, train.py, step.py). The project's own tests must pass on them: its quick
tests, and whole the ones whose outcome depends on the task (TASK_TESTS: N ranks == one process,
exact resume, evaluation). The engine's own tests (signals, locks, launchers, timeouts, ranks
that cannot meet: ENGINE_TESTS and the slow ones) run the engine alike for any task, which it
imports nothing of: the lean row proves them once.

1. Their data and model: a CSV file, a residual network, a setting and a piece of training state
   of their own (engine/state.py, the one place new training state goes), with tests/tiny.toml
   pointed at a sample of the data.
2. Another kind of target: a regression (float targets, an MSE loss, MAE and R² in the console and
   metrics.jsonl) in the three owner files alone, measured by git diff in the project.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import render, run
from test_generated_project import ENGINE_TESTS, TASK_TESTS, run_suite

pytestmark = pytest.mark.slow

# A residual network with LayerNorm and dropout: nothing like the synthetic MLP.
MODEL = '''"""The model: a residual network of LayerNorm blocks with dropout."""

from typing import TYPE_CHECKING

from torch import Tensor, nn

from .data import Sizes

if TYPE_CHECKING:
    from .task import TrainConfig


class Block(nn.Module):
    def __init__(self, width: int, norm: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width) if norm == "layer" else nn.Identity()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(self.norm(x))


def build_model(cfg: "TrainConfig", sizes: Sizes) -> nn.Module:
    blocks = [Block(cfg.hidden_dim, cfg.norm) for _ in range(cfg.depth)]
    first, last = nn.Linear(sizes.input_dim, cfg.hidden_dim), nn.Linear(cfg.hidden_dim, sizes.num_classes)
    return nn.Sequential(first, *blocks, last)
'''
# A setting of the owner's (a str), beside the task's others.
SETTING = """    norm: str = option("layer", "normalisation in each block", choices=("layer", "none"))
"""


def write_csv(path: Path, rows: int, seed: int = 0) -> None:
    """`rows` samples of 6 features and 3 classes that a network can learn."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    lines = ["a,b,c,d,e,f,label"]
    for row, label in zip(x.tolist(), y.tolist(), strict=True):
        lines.append(",".join(f"{v:.5f}" for v in row) + f",{label}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this scripted change"
    path.write_text(text.replace(old, new, 1))


def make_it_the_owners(project: Path, package: str) -> None:
    src = project / "src" / package
    write_csv(project / "data" / "sample.csv", rows=160)
    (src / "model.py").write_text(MODEL)
    edit(src / "task.py", "    depth: int = option(", SETTING + "    depth: int = option(")
    # A piece of training state (engine/state.py, as its docstring says): a field, one line in
    # state_dict() and load_state_dict(), KEYS.
    edit(
        src / "engine" / "state.py",
        "    progress: Progress = field(default_factory=Progress)\n",
        "    progress: Progress = field(default_factory=Progress)\n"
        "    history: list = field(default_factory=list)  # the owner's: restored on resume\n",
    )
    edit(
        src / "engine" / "state.py",
        '            "world_size": len(rng),\n',
        '            "world_size": len(rng),\n            "history": list(self.history),\n',
    )
    edit(
        src / "engine" / "state.py",
        '        self.scaler.load_state_dict(state["scaler"])\n',
        '        self.scaler.load_state_dict(state["scaler"])\n'
        '        self.history = list(state["history"])\n',
    )
    edit(
        src / "engine" / "state.py",
        '    KEYS += ("world_size",)\n',
        '    KEYS += ("world_size", "history")\n',
    )
    # The tests' settings: the sample instead of the synthetic data's sizes.
    tiny = project / "tests" / "tiny.toml"
    lines = tiny.read_text().splitlines()
    dropped = ("num_samples", "val_samples", "input_dim", "num_classes")
    lines = [line for line in lines if not line.startswith(dropped)]
    tiny.write_text("\n".join([*lines, 'data_path = "data/sample.csv"']) + "\n")


def test_the_suite_passes_on_the_owners_model_and_data(template_dir: Path, tmp_path: Path) -> None:
    project = render(template_dir, tmp_path / "owned", launchers=["local"])
    make_it_the_owners(project, "owned")
    selection = [*TASK_TESTS, *(f"tests/{n}" for n in CLASSIFIER_DATA_TESTS)]
    run_suite(sys.executable, project, selection, leave_out=ENGINE_TESTS)


# The regression owner's data.py, task.py and the edits of model.py: float targets of shape
# (batch, num_targets), an MSE loss, MAE and R² of their own.
REGRESSION_DATA = '''"""The data: a synthetic regression made from --seed, held in memory.

To train on your own data, replace `build_datasets` with one returning your training and
validation datasets (samples of (features, targets), the targets float32);
engine/loading.py deals any map-style dataset out to the ranks.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset, TensorDataset

from .engine.loading import Batch

if TYPE_CHECKING:
    from .task import TrainConfig


@dataclass(frozen=True)
class Sizes:
    """The data's sizes."""

    num_samples: int
    val_samples: int
    input_dim: int
    num_targets: int


def prepare(cfg: "TrainConfig") -> Sizes:
    """The synthetic data's sizes: its settings'."""
    return Sizes(cfg.num_samples, cfg.val_samples, cfg.input_dim, cfg.num_targets)


def build_datasets(cfg: "TrainConfig", sizes: Sizes) -> tuple[Dataset, Dataset]:
    """Inputs from a normal distribution, targets from a fixed random 'teacher' network plus
    noise, all from --seed: every rank builds the same data whatever the world size."""
    teacher = torch.Generator().manual_seed(cfg.seed)
    w1 = torch.randn(sizes.input_dim, 64, generator=teacher) / sizes.input_dim**0.5
    w2 = torch.randn(64, sizes.num_targets, generator=teacher) / 8.0

    def make(num: int, seed: int) -> InMemoryDataset:
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(num, sizes.input_dim, generator=generator)
        noise = 0.1 * torch.randn(num, sizes.num_targets, generator=generator)
        return InMemoryDataset(inputs, torch.tanh(inputs @ w1) @ w2 + noise)

    return make(sizes.num_samples, cfg.seed + 1), make(sizes.val_samples, cfg.seed + 2)


class InMemoryDataset(TensorDataset):
    """A TensorDataset that gathers a whole batch at once (one indexing per tensor)."""

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index = torch.as_tensor(indices, dtype=torch.long)
        return Batch(tensor[index] for tensor in self.tensors)
'''
REGRESSION_TASK = '''"""The regression task: its settings and what the engine asks of it (engine/hooks.py)."""

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from . import data, model
from .engine import hooks
from .engine.config import RunConfig
from .engine.files import Stop
from .engine.options import NON_NEGATIVE, POSITIVE, option


@dataclass
class TrainConfig(RunConfig):
    """Every setting of a run: the engine's (engine/config.py), then the task's below."""

    # Data: a synthetic regression made from --seed (data.py).
    num_samples: int = option(8192, "training samples in the synthetic dataset", check=POSITIVE)
    val_samples: int = option(1000, "validation samples", check=POSITIVE)
    input_dim: int = option(32, "features per sample", check=POSITIVE)
    num_targets: int = option(1, "float targets per sample", check=POSITIVE)
    # Model: an MLP (model.py).
    hidden_dim: int = option(256, "width of the hidden layers", check=POSITIVE)
    depth: int = option(
        2, "number of hidden Linear+GELU layers before the output layer", check=NON_NEGATIVE
    )


class Task(hooks.Task):
    """Regression: mean squared error on (features, targets) samples; MAE and R² too."""

    cfg: TrainConfig

    def prepare(self, world_size: int, stop: Stop) -> None:
        self.sizes = data.prepare(self.cfg)

    def build_datasets(self) -> tuple[Dataset, Dataset]:
        return data.build_datasets(self.cfg, self.sizes)

    def build_model(self, cfg: RunConfig) -> nn.Module:
        return model.build_model(cfg, self.sizes)

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        inputs, targets = batch
        return F.mse_loss(model(inputs), targets)

    def eval_sums(self, model: nn.Module, batch: Any) -> Tensor:
        """Sums in float64: squared and absolute errors, the targets and their squares, count."""
        inputs, targets = batch
        y = targets.double()
        error = model(inputs).double() - y
        count = torch.tensor(y.numel()).to(y)
        sums = [error.square().sum(), error.abs().sum(), y.sum(), y.square().sum(), count]
        return torch.stack(sums)

    def eval_record(self, sums: list[float]) -> dict[str, Any]:
        """Mean squared and absolute errors, and R² (the share of the targets' variance
        that the model explains)."""
        squared, absolute, total, total_squares, count = sums
        variance = total_squares / count - (total / count) ** 2
        mse = squared / count
        return {"eval_loss": mse, "eval_mae": absolute / count, "eval_r2": 1 - mse / variance}

    def console(self, record: dict[str, Any]) -> list[str]:
        return [f"eval {record['eval_loss']:.4g} mae {record['eval_mae']:.3f}"]
'''
OWNER_FILES = ("task.py", "model.py", "data.py")
# configs/example.toml's data section, for the regression's settings.
REGRESSION_EXAMPLE = """# Data: a synthetic regression made from --seed
num_samples = 8192
val_samples = 1000
input_dim = 32
num_targets = 1"""
# The classifier's tests of its own data (the synthetic labels, --data-path's files): the owner's
# data replaced that data, so they go with it.
CLASSIFIER_DATA_TESTS = ("test_data.py", "test_data_files.py")


def make_it_a_regression(project: Path, package: str) -> None:
    """The owner's edits: the three owner files, tests/tiny.toml, and the data tests that went."""
    src = project / "src" / package
    (src / "data.py").write_text(REGRESSION_DATA)
    (src / "task.py").write_text(REGRESSION_TASK)
    edit(src / "model.py", "depth: int, num_classes: int)", "depth: int, num_targets: int)")
    edit(src / "model.py", "nn.Linear(width, num_classes)", "nn.Linear(width, num_targets)")
    edit(src / "model.py", "Logits of shape (batch, num_classes)", "Predictions (batch, num_targets)")
    edit(src / "model.py", "cfg.depth, sizes.num_classes)", "cfg.depth, sizes.num_targets)")
    edit(project / "tests" / "tiny.toml", "num_classes = 4\n", "num_targets = 2\n")
    # configs/example.toml holds every setting with its default: the data's section is theirs.
    example = project / "configs" / "example.toml"
    text = example.read_text()
    start, end = text.index("# Data:"), text.index("\n\n# Model")
    example.write_text(text[:start] + REGRESSION_EXAMPLE + text[end:])
    for name in CLASSIFIER_DATA_TESTS:
        (project / "tests" / name).unlink()


def git(project: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=Owner", "-c", "user.email=owner@example.com", *args]
    return subprocess.run(command, cwd=project, check=True, capture_output=True, text=True).stdout


def test_a_regression_costs_the_owner_files_alone_and_the_suite_passes(
    template_dir: Path, tmp_path: Path
) -> None:
    project = render(template_dir, tmp_path / "fit")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "rendered")
    make_it_a_regression(project, "fit")
    # The cost: lines in the owner's three files, none in the machinery (engine/, train, step).
    changed = {}
    for line in git(project, "diff", "--numstat", "--", "src").splitlines():
        added, removed, path = line.split("\t")
        changed[path] = int(added) + int(removed)
    print("the owner's diff:", changed)
    assert changed.keys() <= {f"src/fit/{name}" for name in OWNER_FILES}, changed
    assert sum(changed.values()) <= 250, changed
    # Besides: configs/example.toml's data section (the settings' defaults), counted apart.
    config = git(project, "diff", "--numstat", "--", "configs").split()
    print("configs/example.toml:", config)
    assert config[2:] == ["configs/example.toml"] and int(config[0]) + int(config[1]) <= 20
    others = {line[3:] for line in git(project, "status", "--porcelain").splitlines()}
    owners = {*changed, "tests/tiny.toml", "configs/example.toml"}
    assert others - owners == {f"tests/{n}" for n in CLASSIFIER_DATA_TESTS}
    # The owner's metric in the console line and in metrics.jsonl.
    train = [sys.executable, "-m", "fit.train", "--config=tests/tiny.toml", "--max-steps=5"]
    proc = run([*train, f"--out-dir={tmp_path / 'run'}"], cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last_step = next(line for line in proc.stdout.splitlines() if line.startswith("step 5/5"))
    assert " mae " in last_step, proc.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert {"eval_loss", "eval_mae", "eval_r2"} <= records[-1].keys(), records[-1]
    # The project's quick tests, and whole the tests whose outcome depends on the task.
    run_suite(sys.executable, project, TASK_TESTS, leave_out=ENGINE_TESTS)
