"""Random draws that are the same whatever the world size, the micro-batch, a worker or a resume.

torch's dropout draws its masks from the generator of the process that runs it, so a sample's
mask depends on the rank and micro-batch that hold it, and 2 ranks would not compute what one
process computes. Here a draw is a hash of what it is for: a dropout mask, of (--seed, the step,
the sample's place in the global batch, the module, the element); augmentation, of (--seed, the
epoch, the sample's index). train.py turns torch's dropout modules into KeyedDropouts and checks
the model (check_dropout: a layout that would be keyed wrongly is refused, the draws that cannot
be keyed are named once), and step.py runs each micro-batch inside batch(). F.dropout or
torch.rand in a forward, and the dropout inside nn.MultiheadAttention or an RNN, are not keyed.

The hash is int64 arithmetic on the tensor's device: every operand stays below 2^31 (masked after
each multiply), so no product overflows, and a CPU and a GPU compute the same bits.
"""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

MASK = 0x7FFFFFFF  # 31 bits


def mix(key: Tensor | int, x: Tensor | int, rounds: int = 2) -> Tensor | int:
    """A 31-bit hash of two numbers in [0, 2^31): Python ints, int64 tensors, or both.

    Multiplying by an odd constant (mod 2^31) and xor-ing the high bits into the low ones
    (murmur3's finalizer, cut to 31 bits) spread a change of any input bit over all bits. The
    key enters every round: the hashes of x under two keys are unrelated sequences. One round
    is enough when key and x are hashes already.
    """
    h = x
    for _ in range(rounds):
        # A new tensor (with x and key's broadcast shape), which the next steps update in place:
        # a new tensor per step would make a mask cost twice the time of torch's own dropout.
        h = h ^ key
        h *= 0x2C1B3C6D
        h &= MASK
        h ^= h >> 15
        h *= 0x297A2D39
        h &= MASK
        h ^= h >> 15
    return h


def sample_keys(seed: int, step: int, places: Tensor) -> Tensor:
    """The keys of the samples at `places` of the global batch of optimizer step `step`."""
    return mix(mix(seed & MASK, step & MASK), places)


def generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator for augmenting sample `index` of a dataset in epoch `epoch` (README)."""
    return torch.Generator().manual_seed(mix(mix(seed & MASK, epoch & MASK), index & MASK))


# torch's dropout modules that are keyed: (one draw per channel, alpha dropout, torch's function)
KINDS: dict[type, tuple[bool, bool, Callable[..., Tensor]]] = {
    nn.Dropout: (False, False, F.dropout),
    nn.Dropout1d: (True, False, F.dropout1d),
    nn.Dropout2d: (True, False, F.dropout2d),
    nn.Dropout3d: (True, False, F.dropout3d),
    nn.AlphaDropout: (False, True, F.alpha_dropout),
    nn.FeatureAlphaDropout: (True, True, F.feature_alpha_dropout),
}
ALPHA = 1.7580993408473766  # SELU's -scale * alpha: what alpha dropout sets a dropped element to


class LayoutError(ValueError):
    """A dropout whose input does not hold the batch in dim 0: its masks would be keyed wrongly."""


class KeyedDropout(nn.Module):
    """nn.Dropout(p) with keyed masks; `site` tells a model's dropouts apart; `kind`: the module
    it replaces, one of KINDS (Dropout1d/2d/3d: a draw per channel of an (N, C, ...) input).

    An element (a channel) is dropped where the hash of (its sample's key, site, its index in
    the sample) is below p 2^31; the kept ones are scaled by 1 / (1 - p) (alpha dropout: as
    torch does). Dim 0 of the input is the batch, and a sample has fewer than 2^31 elements.
    Outside batch() it is torch's dropout, not keyed.
    """

    def __init__(self, p: float, site: int, kind: type = nn.Dropout) -> None:
        super().__init__()
        self.p, self.site, self.kind = p, site, kind.__name__
        self.per_channel, self.alpha, self.unkeyed = KINDS[kind]
        self.keys: Tensor | None = None  # the micro-batch's sample keys, set by batch()

    def extra_repr(self) -> str:
        return f"p={self.p}, site={self.site}, kind={self.kind}"

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if self.keys is None:
            return self.unkeyed(x, self.p, True)
        if len(x) != len(self.keys):
            raise LayoutError(f"KeyedDropout: dim 0 of a {tuple(x.shape)} input is not the batch")
        # One draw per element, or per channel (dim 1) broadcast over the rest of a sample.
        shape = x.shape[:2] if self.per_channel else x.shape
        # A hash per sample (its key, the site) and one per element of a sample (its index,
        # the site), mixed together: one round per element, where hashing each element from
        # scratch would take two.
        rows = mix(self.keys, self.site).view(-1, *[1] * (len(shape) - 1))
        places = mix(self.site, torch.arange(shape[1:].numel(), device=x.device))
        keep = mix(rows, places.view(shape[1:]), rounds=1) >= int(self.p * (MASK + 1))
        keep = keep.view(*shape, *[1] * (x.dim() - len(shape)))
        if self.alpha:  # a * x + b where kept, else a * (-ALPHA) + b: mean and variance kept
            a = ((ALPHA * ALPHA * self.p + 1) * (1 - self.p)) ** -0.5
            return torch.where(keep, x * a + ALPHA * a * self.p, ALPHA * a * (self.p - 1))
        # x / (1 - p) where kept, else 0; the division in place costs one tensor less. The
        # backward keeps the mask as bools: a quarter of a float32 mask's memory.
        return x.mul(keep).div_(1 - self.p)


def convert_dropout(model: nn.Module) -> nn.Module:
    """Replace every dropout module of KINDS (p > 0) in `model` by a KeyedDropout, their sites
    numbered in the model's order (as nn.SyncBatchNorm.convert_sync_batchnorm does for
    BatchNorm)."""
    plain = [name for name, m in model.named_modules() if type(m) in KINDS and m.p > 0]
    for site, name in enumerate(plain):
        parent, _, child = name.rpartition(".")
        old = model.get_submodule(name)
        new = KeyedDropout(old.p, site, type(old)).train(old.training)
        setattr(model.get_submodule(parent), child, new)
    return model


def check_dropout(model: nn.Module, run: Callable[[int], object]) -> str:
    """Refuse (LayoutError) a model whose KeyedDropouts would be keyed by something else than
    the sample; return a line naming the random draws in its training forward that are not
    keyed ('' if none). `run(n)`: the model's training forward on a batch of n copies of one
    sample (the task's loss of it).

    Seen from the modules: a layer with batch_first=False holding a KeyedDropout (refused),
    nn.MultiheadAttention's dropout (drawn inside its attention kernel: keying it would mean
    computing attention without the fused kernels), an RNN's dropout between layers, dropout
    modules of other classes. Seen by running the model in training mode on 2 and then 3 copies
    of a sample (no gradient; random state and buffers restored): a KeyedDropout whose input's
    dim 0 is not the batch (refused), and random functions that the forward calls (F.dropout,
    torch.rand, ...). A code path that these two forwards do not take is not seen.
    """
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

    def __init__(self, running: list[tuple[str, nn.Module]]) -> None:
        super().__init__()
        self.running = running
        self.found: dict[str, list[str]] = {}  # module name: the functions it called

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.running and draws(name, args, kwargs):
            called = self.found.setdefault(self.running[-1][0], [])
            if name not in called:
                called.append(name)
        return func(*args, **kwargs)


def probe(model: nn.Module, run: Callable[[int], object]) -> dict[str, str]:
    """Run `model` in training mode on 2, then 3 copies of a sample (`run`): raise LayoutError for a
    KeyedDropout whose input's dim 0 is not the batch; return the modules that called a
    random function (name: what). Random state, buffers and modes are restored; BatchNorm runs
    in evaluation mode. {} if the model cannot run on so small a batch."""
    running: list[tuple[str, nn.Module]] = []  # the modules in their forward, innermost last
    batch_size = 0

    def enter(name: str, module: nn.Module, inputs: tuple) -> None:
        running.append((name, module))
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
    buffers = [(b, b.clone()) for b in model.buffers()]
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
        with torch.no_grad(), torch.random.fork_rng([device] if device.type == "cuda" else []):
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
        with torch.no_grad():
            for tensor, saved in buffers:
                tensor.copy_(saved)
    return {
        name: f"{', '.join(f'{f}()' for f in called)} in {type(model.get_submodule(name)).__name__}"
        for name, called in found.found.items()
    }


@contextmanager
def batch(model: nn.Module, seed: int, step: int, places: range, device: torch.device) -> Iterator:
    """Run `model`'s KeyedDropouts on one micro-batch, whose samples are at `places` of the
    global batch of optimizer step `step`. A model without one computes nothing here."""
    dropouts = [m for m in model.modules() if isinstance(m, KeyedDropout)]
    if dropouts:
        where = torch.arange(places.start, places.stop, places.step, device=device)
        keys = sample_keys(seed, step, where)
    for module in dropouts:
        module.keys = keys
    try:
        yield
    finally:
        for module in dropouts:
            module.keys = None
