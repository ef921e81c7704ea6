"""Can this run use a loaded checkpoint? Its structure checked, its model's names, shapes and
values compared with the model this config builds: before the process group exists, so that a
bad file is one line (resume.py) instead of a traceback on some ranks.
"""

import random
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch
from torch import nn

from . import dist
from .config import ConfigError, RunConfig, flag
from .nonfinite import first_non_finite

Shapes = dict[str, tuple[int, ...]]


def check_structure(state: Any, required: set[str]) -> None:
    """Raise ValueError unless `state` has the entries and types that training reads."""
    if not isinstance(state, dict):
        raise ValueError(f"{type(state).__name__}, not a checkpoint")
    if not required <= state.keys():
        raise ValueError(f"missing {sorted(required - state.keys())}")
    kinds = {"model": dict, "config": dict, "optimizer": dict, "scheduler": dict, "scaler": dict}
    kinds |= {"step": int, "epoch": int, "position": int, "world_size": int, "rng": list}
    for key, kind in kinds.items():
        if key in required and not isinstance(state[key], kind):
            raise ValueError(f"'{key}' is {type(state[key]).__name__}, not {kind.__name__}")
    if not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise ValueError("'model' is not a state_dict (name -> tensor)")
    names = ("batch_size", "grad_accum_steps", "max_steps") if "optimizer" in required else ()
    for name in names:  # read by check_compatible and the schedule
        if not isinstance(state["config"].get(name), int):
            raise ValueError(f"'config' has no integer {name!r}")
    if "rng" in required:
        if len(state["rng"]) != state["world_size"]:
            raise ValueError(f"'rng' has {len(state['rng'])} entries, not one per rank")
        for rank, rng in enumerate(state["rng"]):
            try:  # set them on throwaway generators: the real ones are set after start-up
                random.Random().setstate(rng["python"])
                torch.Generator().set_state(rng["torch"].cpu())
                if not (rng["cuda"] is None or isinstance(rng["cuda"], torch.Tensor)):
                    raise TypeError(f"'cuda' is {type(rng['cuda']).__name__}")
            except Exception as err:
                raise ValueError(f"'rng' of rank {rank} is unusable ({first_line(err)})") from None


class ModelShapes:
    """The parameter and buffer shapes of the model `build` makes for some settings, built on
    the meta device (no memory, no time) once per settings. A model that cannot be built there
    (it loads files, say) leaves the shape checks undone, said once in one line."""

    def __init__(self, build: Callable[[RunConfig], nn.Module]) -> None:
        self.build, self.known = build, dict[str, Shapes | None]()

    def __call__(self, cfg: RunConfig, what: str) -> Shapes | None:
        key = repr(asdict(cfg))
        if key not in self.known:
            self.known[key] = self._build(cfg, what)
        return self.known[key]

    def _build(self, cfg: RunConfig, what: str) -> Shapes | None:
        try:
            with torch.device("meta"):
                model = self.build(cfg)
        except ConfigError:
            raise
        except Exception as err:
            if not self.known:  # the first build: later ones would only say it again
                dist.print0(
                    f"note: {what}: its model's shapes are not checked before start-up, since"
                    f" build_model cannot run on the meta device ({first_line(err)})"
                )
            return None
        return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def model_differences(
    saved: dict[str, Any], cfg: RunConfig, ignore: set[str], shapes: ModelShapes, what: str
) -> list[str]:
    """The settings in which `saved` differs from `cfg` and that change the model's shapes."""
    expected, differences = shapes(cfg, what), []
    for name, now in asdict(cfg).items():
        if name in ignore or name not in saved or saved[name] == now:
            continue
        try:
            other = shapes(replace(cfg, **{name: saved[name]}), what)
        except ConfigError:  # a value this version no longer accepts: not a model setting
            continue
        if other != expected:
            differences.append(f"{flag(name)} {saved[name]!r} in the checkpoint, {now!r} now")
    return differences


def check_same_kind(weights: dict[str, torch.Tensor], expected: Shapes | None, what: str) -> None:
    """A checkpoint of another task or project shares no weight name with this model."""
    if expected is None or not weights or expected.keys() & weights.keys():
        return
    raise ConfigError(
        f"{what}: a checkpoint of another kind of model (another task or project): none of its"
        f" weights ({', '.join(list(weights)[:2])}, ...) is one of this model's"
        f" ({', '.join(list(expected)[:2])}, ...)"
    )


def check_model_fits(weights: dict[str, torch.Tensor], expected: Shapes | None, what: str) -> None:
    """The checkpoint's weights have the names and shapes of the model this run builds
    (`expected`; None: unknown), and hold no NaN or infinity."""
    got = {name: tuple(tensor.shape) for name, tensor in weights.items()}
    bad = first_non_finite(weights)
    if bad:
        raise ConfigError(f"{what}: its weights hold non-finite values (NaN or inf), in {bad}")
    if expected is None or got == expected:
        return
    problems = [f"missing {name}" for name in sorted(expected.keys() - got.keys())]
    problems += [f"unexpected {name}" for name in sorted(got.keys() - expected.keys())]
    problems += [
        f"{name} of shape {got[name]}, not {expected[name]}"
        for name in sorted(expected.keys() & got.keys())
        if got[name] != expected[name]
    ]
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    raise ConfigError(
        f"{what}: its model does not fit the model this run builds ({', '.join(problems[:3])}"
        f"{more}); was model.py changed since it was saved?"
    )


def first_line(err: Exception) -> str:
    """'EOFError' or 'KeyError: 101': the kind of error and its first line, if any."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
