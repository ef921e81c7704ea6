"""The random draws of a model that keyed.py does not key, named once at the start, and the
layouts it would key wrongly, refused (LayoutError): check_dropout, which train.py calls.

Seen from the modules: a layer with batch_first=False holding a KeyedDropout (refused),
nn.MultiheadAttention's dropout (drawn inside its attention kernel: keying it would mean
computing attention without the fused kernels), an RNN's dropout between layers, dropout
modules of other classes. Seen by running the model in training mode on 2 and then 3 copies of
a sample (probe): a KeyedDropout whose input's dim 0 is not the batch (refused), and random
functions that the forward calls (F.dropout, torch.rand, ...). A code path that these two
forwards do not take is not seen.
"""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .keyed import KeyedDropout, LayoutError, batch


def check_dropout(model: nn.Module, run: Callable[[int], object]) -> str:
    """Refuse (LayoutError) a model whose KeyedDropouts would be keyed by something else than
    the sample; return a line naming the random draws in its training forward that are not
    keyed ('' if none). `run(n)`: the model's training forward on a batch of n copies of one
    sample (the task's loss of it)."""
    for name, module in model.named_modules():
        layer = isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))
        batch_first = getattr(module.self_attn if layer else module, "batch_first", None)
        if batch_first is False and any(isinstance(m, KeyedDropout) for m in module.modules()):
            raise LayoutError(
                f"{name or 'the model'} ({type(module).__name__}) has batch_first=False: its"
                " dropout would be keyed by position in the sequence, not by sample; build it"
                " with batch_first=True and give it (batch, sequence, features) inputs"
            )
    called = probe(model, run)
    names: dict[str, list[str]] = {}  # what is drawn: the modules that draw it, in model order
    for name, module in model.named_modules():
        what = unkeyed_module(module) or called.get(name)
        if what:
            names.setdefault(what, []).append(name or "the model")
    if not names:
        return ""
    listed = "; ".join(f"{what} ({', '.join(few(where))})" for what, where in names.items())
    return (
        f"random draws that are not keyed: {listed}. So 2 ranks do not compute what 1 process"
        " computes, and a resume on another world size is not exact (docs/testing.md)"
    )


def few(names: list[str], shown: int = 3) -> list[str]:
    """The first `shown` names, and how many more."""
    more = [f"{len(names) - shown} more"] if len(names) > shown else []
    return names[:shown] + more


def unkeyed_module(module: nn.Module) -> str:
    """What `module` draws at random in training that is not keyed; '' if nothing."""
    kind = type(module).__name__
    if isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
        return f"{kind}'s dropout of the attention weights"
    if isinstance(module, nn.RNNBase) and module.dropout > 0 and module.num_layers > 1:
        return f"{kind}'s dropout between layers"
    if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
        return f"{kind}, a dropout module that is not keyed"
    if isinstance(module, nn.RReLU):
        return f"{kind}'s random slopes"
    return ""


# Functions that draw at random whatever their arguments.
DRAW = {
    *("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm"),
    *("bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "poisson", "uniform_"),
    *("random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "gumbel_softmax"),
}
# Functions that draw only in training with a share p > 0: where p and training are given
# (position, names, default), or None: no such argument (p: always draws; training: always on).
Argument = tuple[int, tuple[str, ...], object] | None
TRAINING, TRAIN = (2, ("training", "train"), True), (2, ("training", "train"), False)
DRAW_IF: dict[str, tuple[Argument, Argument]] = {
    **{n: ((1, ("p",), 0.5), TRAINING) for n in ("dropout", "dropout1d", "dropout2d")},
    **{n: ((1, ("p",), 0.5), TRAINING) for n in ("dropout3d", "feature_dropout")},
    **{n: ((1, ("p",), 0.5), TRAIN) for n in ("alpha_dropout", "feature_alpha_dropout")},
    "scaled_dot_product_attention": ((4, ("dropout_p",), 0.0), None),
    "multi_head_attention_forward": ((10, ("dropout_p",), 0.0), (13, ("training",), True)),
    "rrelu": (None, (3, ("training",), False)),
}


def draws(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call of the torch function `name` with these arguments draws at random."""
    if name in DRAW:
        return True
    if name not in DRAW_IF:
        return False

    def value(argument: Argument) -> object:
        if argument is None:
            return True
        at, names, default = argument
        given = [kwargs[n] for n in names if n in kwargs]
        return given[0] if given else args[at] if at < len(args) else default

    p, training = DRAW_IF[name]
    return bool(value(training)) and float(value(p)) > 0  # type: ignore[arg-type]


class Draws(TorchFunctionMode):
    """Notes the torch functions that draw at random, with the innermost module running."""

    def __init__(self, running: list[str]) -> None:
        super().__init__()
        self.running = running
        self.found: dict[str, list[str]] = {}  # module name: the functions it called

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.running and draws(name, args, kwargs):
            called = self.found.setdefault(self.running[-1], [])
            if name not in called:
                called.append(name)
        return func(*args, **kwargs)


def probe(model: nn.Module, run: Callable[[int], object]) -> dict[str, str]:
    """Run `model` in training mode on 2, then 3 copies of a sample (`run`): raise LayoutError for a
    KeyedDropout whose input's dim 0 is not the batch; return the modules that called a
    random function (name: what). Random state, buffers and modes are restored; BatchNorm runs
    in evaluation mode. {} if the model cannot run on so small a batch."""
    running: list[str] = []  # the modules in their forward, innermost last
    batch_size = 0

    def enter(name: str, module: nn.Module, inputs: tuple) -> None:
        running.append(name)
        x = inputs[0] if inputs else None
        if isinstance(module, KeyedDropout) and isinstance(x, Tensor) and len(x) != batch_size:
            raise LayoutError(
                f"{name} (KeyedDropout, from nn.{module.kind}) gets a {tuple(x.shape)} input from"
                f" a batch of {batch_size}: dim 0 is not the batch, so its masks would be keyed"
                " by something else than the sample; give it the batch in dim 0"
            )

    def leave(*_: object) -> None:
        running.pop()

    modes = {m: m.training for m in model.modules()}
    hooks = []
    for name, module in model.named_modules():
        hooks.append(module.register_forward_pre_hook(functools.partial(enter, name)))
        hooks.append(module.register_forward_hook(leave, always_call=True))
    model.train()
    for module in model.modules():  # nothing random, and statistics that must not change
        if isinstance(module, nn.modules.batchnorm._NormBase):
            module.eval()
    found = Draws(running)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        with (
            torch.no_grad(),
            torch.random.fork_rng([device] if device.type == "cuda" else []),
            keeping_buffers(model),
        ):
            for batch_size in (2, 3):
                with batch(model, 0, 0, range(batch_size), device), found:
                    run(batch_size)
    except LayoutError:
        raise
    except Exception:  # it needs another input: training will say what is wrong
        return {}
    finally:
        for hook in hooks:
            hook.remove()
        for module, training in modes.items():
            module.training = training
    return {
        name: f"{', '.join(f'{f}()' for f in called)} in {type(model.get_submodule(name)).__name__}"
        for name, called in found.found.items()
    }


@contextmanager
def keeping_buffers(model: nn.Module) -> Iterator[None]:
    """Put the model's buffers (BatchNorm's running statistics) back as they were on leaving."""
    saved = [(buffer, buffer.clone()) for buffer in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
