"""A run's settings from its command line: defaults, then a --config file, then flags
(parse_args), checked for this world size and against the file system (check_paths); and
written back to OUT_DIR/config.toml, which --config reads (write_settings).
"""

import argparse
import os
import platform
import shlex
import time
from pathlib import Path
from typing import TypeVar

import torch

from . import options, paths
from .config import RunConfig, resolve_batch
from .options import ConfigError, flag

TOP = __package__.rpartition(".")[0]  # the project's package: python -m TOP.train
C = TypeVar("C", bound=RunConfig)


def build_parser(cls: type) -> argparse.ArgumentParser:
    """One flag per field of config class `cls`, and --config FILE."""
    description = "Train with DistributedDataParallel (run it with or without torchrun)."
    return options.flag_parser(cls, f"python -m {TOP}.train", description)


def parse_args(  # noqa: UP047 (a type parameter needs Python 3.12)
    cls: type[C], argv: list[str] | None = None, world_size: int = 1
) -> C:
    """Defaults, then the --config file, then flags; validated for this world size."""
    flags = vars(build_parser(cls).parse_args(argv))
    values = options.read_toml(flags.pop("config"), cls) if "config" in flags else {}
    values.update(flags)
    cfg = resolve_batch(cls(**values), world_size)
    cfg.given_settings = frozenset(values)  # type: ignore[attr-defined]  # not a setting: given()
    check_paths(cfg)
    return cfg


def write_settings(cfg: RunConfig, world_size: int, argv: list[str]) -> str | None:
    """OUT_DIR/config.toml, which `--config` reads back (rank 0); why it failed, or None."""
    path = Path(cfg.out_dir) / paths.CONFIG
    comments = [
        f"The settings of the run in {cfg.out_dir}, rewritten at its every (re)start. Repeat with",
        f"  python -m {TOP}.train --config {path}",
        f"Started {time.strftime('%Y-%m-%d %H:%M:%S')}, world size {world_size},"
        f" torch {torch.__version__}, python {platform.python_version()}; its command line:",
        f"  python -m {TOP}.train {shlex.join(argv)}".rstrip(),
    ]
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(options.to_toml(cfg, comments), encoding="utf-8")
        os.replace(tmp, path)  # readers never see half a file
    except OSError as err:
        tmp.unlink(missing_ok=True)
        return f"cannot write {path}: {err.strerror or err}"
    return None


def check_paths(cfg: RunConfig) -> None:
    """The paths the settings name exist, or can be written; ConfigError if not. Not one of
    RunConfig's checks: a checkpoint's config stays valid where its paths do not exist."""
    for name in ("resume", "init_from"):
        path = getattr(cfg, name)
        if name == "init_from" and is_scheme(path):
            continue  # weights the task resolves (lm: hf:NAME), or says what is wrong
        if path not in ("", "auto", "never") and not Path(path).exists():
            hint = " (or use auto or never)" if name == "resume" else ""
            raise ConfigError(f"{flag(name)} {path}: no such file or directory{hint}")
    if not cfg.out_dir:
        raise ConfigError("--out-dir must not be empty (use . for the current directory)")
    out_dir = Path(cfg.out_dir)
    try:
        existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    except OSError as err:  # a directory on the way that we may not look into
        raise ConfigError(f"--out-dir {cfg.out_dir}: {err}") from None
    if not existing.is_dir():
        what = "is a file" if existing == out_dir else f"cannot be created: {existing} is a file"
        raise ConfigError(f"--out-dir {cfg.out_dir} {what}, not a directory; use another --out-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--out-dir {cfg.out_dir}: cannot write in {existing} (no permission, or a read-only"
            " file system); use another --out-dir"
        )


def is_scheme(path: str) -> bool:
    """'hf:gpt2': a name the task's Task.init_weights resolves, not a file path."""
    prefix, colon, _ = path.partition(":")
    return bool(colon) and prefix.isidentifier() and "/" not in prefix
