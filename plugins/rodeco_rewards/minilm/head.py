"""The Bradley-Terry head of the embedded RM: standardize features, then a linear map (or a small MLP) to a scalar.

Saved as ``<stem>.safetensors`` (weights and the feature mean/std) plus ``<stem>.json`` (shape, training command,
data hashes, metrics, score statistics). ``P(a preferred to b) = sigmoid(head(a) - head(b))``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class HeadShape:
    in_dim: int
    hidden: int = 0  # 0: linear head


class BTHead(nn.Module):
    mu: torch.Tensor  # buffers: the features' standardization
    sigma: torch.Tensor

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        self.shape = shape
        self.register_buffer("mu", torch.zeros(shape.in_dim))
        self.register_buffer("sigma", torch.ones(shape.in_dim))
        if shape.hidden:
            self.net: nn.Module = nn.Sequential(
                nn.Linear(shape.in_dim, shape.hidden), nn.GELU(), nn.Linear(shape.hidden, 1)
            )
        else:
            self.net = nn.Linear(shape.in_dim, 1)

    @property
    def first_layer(self) -> nn.Linear:
        """The layer the standardized features enter: the whole net of a linear head."""
        layer = self.net[0] if isinstance(self.net, nn.Sequential) else self.net
        assert isinstance(layer, nn.Linear)
        return layer

    def set_standardization(self, x: torch.Tensor) -> None:
        """Feature mean and std from training rows ``x [n, in_dim]`` (a constant feature keeps std 1)."""
        self.mu.copy_(x.mean(0))
        sd = x.std(0)
        self.sigma.copy_(torch.where(sd > 1e-6, sd, torch.ones_like(sd)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [n, in_dim] -> [n]`` rewards."""
        return self.net((x - self.mu) / self.sigma)[:, 0]


def head_identity(head: BTHead) -> str:
    """What the reward's scores depend on beyond its config node (a pool's score cache is keyed by it)."""
    return hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in head.state_dict().values())).hexdigest()[
        :16
    ]


def save_head(head: BTHead, stem: Path, meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    stem.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(stem) + ".safetensors")
    meta = {"shape": asdict(head.shape), **meta}
    Path(str(stem) + ".json").write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def load_head(stem: Path) -> tuple[BTHead, dict[str, Any]]:
    from safetensors.torch import load_file

    meta = json.loads(Path(str(stem) + ".json").read_text(encoding="utf-8"))
    head = BTHead(HeadShape(**meta["shape"]))
    head.load_state_dict(load_file(str(stem) + ".safetensors"))
    return head.eval(), meta
