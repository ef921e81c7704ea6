"""How a dataclass field becomes a checked flag and a TOML key (config.py declares the fields).

Nothing here knows TrainConfig: option() describes a field, checked() validates its value, and
flag_parser, read_toml and to_toml turn such a dataclass into flags and TOML files and back.
"""

import argparse
import json
import math
import tomllib
from dataclasses import Field, field, fields
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A user mistake in flags, config file or environment; the message says how to fix it."""


POSITIVE, NON_NEGATIVE = "positive", "non-negative"  # the checks option() knows by name


def option(
    default: Any,
    help: str,
    *,
    check: str = "",
    choices: tuple[str, ...] = (),
    within: tuple[int, int, str] | None = None,
    run_only: bool = False,
    before: Any = None,
) -> Any:
    """A field and its flag. check: POSITIVE or NON_NEGATIVE; within: (low, high, why).

    run_only: changes where and how often things are written, not what is computed, so a
    resume may change it (resume.py); every other setting must match the checkpoint's.
    before: the value that checkpoints written before this setting existed were trained with,
    if not its default (None: the default). A new setting needs nothing else to resume them.
    """
    metadata = {"help": help, "check": check, "choices": choices, "within": within}
    before = default if before is None else before
    return field(default=default, metadata={**metadata, "run_only": run_only, "before": before})


def values_before(config: type) -> dict[str, Any]:
    """What each setting of `config` was before it existed (option's `before`): what a
    checkpoint that lacks it was trained with."""
    return {f.name: f.metadata["before"] for f in fields(config)}


def flag(name: str) -> str:
    """The command-line flag of a field: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def checked(f: Field, value: Any) -> Any:
    """The value if valid for its field (an int is taken as a float); ConfigError if not."""
    name, rule = flag(f.name), f.metadata
    if f.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, f.type) or (f.type is not bool and isinstance(value, bool)):
        kind = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
        raise ConfigError(f"{name} must be {kind[f.type]}, got {value!r}")  # a file's mistake
    if f.type is float and not math.isfinite(value):  # inf and nan would poison the run silently
        raise ConfigError(f"{name} must be a finite number, got {value}")
    if f.type is str and "\0" in value:  # a path with a NUL byte fails deep inside the OS calls
        raise ConfigError(f"{name} must not contain a NUL character")
    if rule["check"] == POSITIVE and value <= 0:
        raise ConfigError(f"{name} must be a positive integer ({rule['help']}), got {value}")
    if rule["check"] == NON_NEGATIVE and value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")
    if rule["choices"] and value not in rule["choices"]:
        raise ConfigError(f"{name} must be one of {', '.join(rule['choices'])}, got {value!r}")
    if rule["within"] and not rule["within"][0] <= value <= rule["within"][1]:
        low, high, why = rule["within"]
        raise ConfigError(f"{name} must be from {low} to {high} ({why}), got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)  # one line naming the flag, not the whole usage


def flag_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """--config FILE and one flag per field of `cls`; given flags only (no defaults), so that
    a --config file can fill the rest."""
    parser = _Parser(
        prog, description=description, argument_default=argparse.SUPPRESS, allow_abbrev=False
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file of settings; flags win")
    for f in fields(cls):
        help = f.metadata["help"]
        if "(default" not in help:  # a help that says what its default means says it best
            help += f" (default: {f.default if f.default != '' else 'none'})"
        if f.type is bool:
            parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, help=help)
            continue
        choices = f.metadata["choices"] or None
        metavar = None if choices else f.type.__name__.upper()  # --lr FLOAT, not --lr LR
        parser.add_argument(flag(f.name), type=f.type, choices=choices, metavar=metavar, help=help)
    return parser


def read_toml(path: str, cls: type) -> dict[str, Any]:
    """A --config file's values; a key that is no field of `cls` is an error, not ignored."""
    if Path(path).exists() and not Path(path).is_file():  # a directory, /dev/zero, a pipe
        raise ConfigError(f"--config {path}: not a file")
    try:
        with open(path, "rb") as file:
            values = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"--config {path}: {err}") from None
    except UnicodeDecodeError as err:  # TOML files are UTF-8 by definition
        why = f"{err.reason} at byte {err.start}"
        raise ConfigError(f"--config {path}: not UTF-8 text ({why})") from None
    unknown = [key for key in values if key not in {f.name for f in fields(cls)}]
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown key {unknown[0]!r}"
            " (keys are the flag names with '_', e.g. batch_size)"
        )
    return values


def to_toml(settings: Any, comments: list[str]) -> str:
    """The settings as a TOML file that read_toml reads back into the same values."""
    # A comment stays on its line (control characters escaped). A JSON value is a TOML one:
    # true/false, ints, finite floats (1e-05), and strings with their escapes.
    lines = ["# " + "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s) for s in comments]
    lines += [f"{f.name} = {json.dumps(getattr(settings, f.name))}" for f in fields(settings)]
    return "\n".join(lines) + "\n"
