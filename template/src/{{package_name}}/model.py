"""The model: a plain MLP. Replace `build_model` to train your own network."""

from torch import Tensor, nn

from .config import TrainConfig


class MLP(nn.Module):
    """`depth` hidden Linear+GELU layers, then a Linear output layer.

    No dropout and no batch norm: the forward pass is a pure function of the parameters and
    the batch, so N ranks and one process compute the same update (the equivalence test
    relies on it). BatchNorm would need SyncBatchNorm to see the global batch.
    """

    def __init__(self, input_dim: int, hidden_dim: int, depth: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden_dim), nn.GELU()]
            width = hidden_dim
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape (batch, num_classes) for inputs of shape (batch, input_dim)."""
        return self.net(x)


def build_model(cfg: TrainConfig) -> nn.Module:
    """The network to train. Seed before calling it so every rank starts from the same weights."""
    return MLP(cfg.input_dim, cfg.hidden_dim, cfg.depth, cfg.num_classes)
