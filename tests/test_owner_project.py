"""A generated project made its owner's: their data, their model, a setting and a piece of
training state of their own, as the generated README's "Your own model and data" says. The
project's own suite (N ranks == one process, exact resume, evaluation, faults) must pass on
them with nothing else changed but tests/tiny.toml pointed at a sample of the data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import render, run

pytestmark = pytest.mark.slow

# A residual network with LayerNorm and dropout: nothing like the synthetic MLP.
MODEL = '''"""The model: a residual network of LayerNorm blocks with dropout."""

from torch import Tensor, nn

from .config import TrainConfig


class Block(nn.Module):
    def __init__(self, width: int, norm: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width) if norm == "layer" else nn.Identity()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(self.norm(x))


def build_model(cfg: TrainConfig) -> nn.Module:
    blocks = [Block(cfg.hidden_dim, cfg.norm) for _ in range(cfg.depth)]
    return nn.Sequential(
        nn.Linear(cfg.input_dim, cfg.hidden_dim), *blocks, nn.Linear(cfg.hidden_dim, cfg.num_classes)
    )
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
    # A piece of training state: a field, one line in state_dict() and load_state_dict(), KEYS.
    edit(
        src / "state.py",
        "    progress: Progress = field(default_factory=Progress)\n",
        "    progress: Progress = field(default_factory=Progress)\n"
        "    history: list = field(default_factory=list)  # the owner's: restored on resume\n",
    )
    edit(
        src / "state.py",
        '            "world_size": len(rng),\n',
        '            "world_size": len(rng),\n            "history": list(self.history),\n',
    )
    edit(
        src / "state.py",
        '        self.scaler.load_state_dict(state["scaler"])\n',
        '        self.scaler.load_state_dict(state["scaler"])\n'
        '        self.history = list(state["history"])\n',
    )
    edit(src / "state.py", '    KEYS += ("world_size",)\n', '    KEYS += ("world_size", "history")\n')
    # The tests' settings: the sample instead of the synthetic data's sizes.
    tiny = project / "tests" / "tiny.toml"
    lines = tiny.read_text().splitlines()
    dropped = ("num_samples", "val_samples", "input_dim", "num_classes")
    lines = [line for line in lines if not line.startswith(dropped)]
    tiny.write_text("\n".join([*lines, 'data_path = "data/sample.csv"']) + "\n")


def test_the_whole_suite_passes_on_the_owners_model_and_data(template_dir: Path, tmp_path: Path) -> None:
    project = render(template_dir, tmp_path / "owned", launchers=["local"])
    make_it_the_owners(project, "owned")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    proc = run(command, cwd=project, timeout=2400)
    tail = proc.stdout[-6000:] + "\n--- stderr ---\n" + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "no tests ran" not in proc.stdout, tail
