from __future__ import annotations

import pytest
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        return x + self.proj(v) + self.fc(q).chunk(4, dim=-1)[0] + k


class TinyLM(nn.Module):
    """A small transformer-shaped model: embeddings, blocks, final norm, head (tied or not)."""

    def __init__(self, vocab: int = 32, d: int = 16, n_layer: int = 2, tied: bool = False) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def loss_of(model: TinyLM, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 32, (4, 8), generator=generator)
    logits = model(idx)
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), idx.roll(-1, 1).reshape(-1)
    )


@pytest.fixture
def tiny_lm() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


@pytest.fixture
def make_lm():
    """Factory for fresh TinyLMs (tests cannot import conftest under importlib mode)."""

    def make(tied: bool = False) -> TinyLM:
        torch.manual_seed(0)
        return TinyLM(tied=tied)

    return make


@pytest.fixture
def lm_loss():
    """The deterministic training loss of a TinyLM for a given seed."""
    return loss_of
