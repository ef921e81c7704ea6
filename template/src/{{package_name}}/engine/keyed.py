"""Random draws that are the same whatever the world size, the micro-batch, a worker or a resume.

torch's dropout draws its masks from the generator of the process that runs it, so a sample's
mask depends on the rank and micro-batch that hold it, and 2 ranks would not compute what one
process computes. Here a draw is a hash of what it is for: a dropout mask, of (--seed, the step,
the sample's place in the global batch, the module, the element); augmentation, of (--seed, the
epoch, the sample's index). train.py turns torch's dropout modules into KeyedDropouts (and
checks the model: unkeyed.py), and step.py runs each micro-batch inside batch(). F.dropout or
torch.rand in a forward, and the dropout inside nn.MultiheadAttention or an RNN, are not keyed.

The hash is int64 arithmetic on the tensor's device: every operand stays below 2^31 (masked after
each multiply), so no product overflows, and a CPU and a GPU compute the same bits.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
