"""Tiny hand-written models, loaders and recorders shared by the trainer tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from speedtronic_config import SpeedtronicConfig

VOCAB = 11
SEQ = 6


class TokenDataset(Dataset):
    """Deterministic causal samples; index i always yields the same tokens."""

    def __init__(
        self, n: int = 16, seq: int = SEQ, vocab: int = VOCAB, ignore_every: int = 0
    ) -> None:
        g = torch.Generator().manual_seed(7)
        self.tokens = torch.randint(0, vocab, (n, seq + 1), generator=g)
        self.ignore_every = ignore_every

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.tokens[i, 1:].clone()
        if self.ignore_every:
            # a different number of ignored positions per sample, so microbatch token counts differ
            labels[: i % self.ignore_every] = -100
        return {"input_ids": self.tokens[i, :-1], "labels": labels}


class TinyLM(nn.Module):
    """Embedding + dropout + linear head; returns {'logits': ...} so the trainer computes the
    loss.
    """

    def __init__(self, vocab: int = VOCAB, dim: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, vocab)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_: object
    ) -> dict:
        return {"logits": self.head(self.drop(self.embed(input_ids)))}

    def flops_per_token(self) -> float:
        return 6.0 * sum(p.numel() for p in self.parameters())


def make_loader(
    dataset: Dataset | None = None, batch_size: int = 2, shuffle: bool = False, **kwargs
) -> DataLoader:
    return DataLoader(dataset or TokenDataset(), batch_size=batch_size, shuffle=shuffle, **kwargs)


def make_config(**sections) -> SpeedtronicConfig:
    """A validated config from the sections a test sets; everything else keeps its default."""
    return SpeedtronicConfig.from_dict(sections)


class RecordingHook:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def on_event(self, event: str, payload: dict) -> None:
        self.events.append((event, dict(payload)))

    def values(self, event: str, key: str) -> list:
        return [p[key] for e, p in self.events if e == event and key in p]
