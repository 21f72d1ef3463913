"""Reproducible random tokens: the zero-setup data source."""

from __future__ import annotations

import operator

import torch
from torch.utils.data import Dataset

from speedtronic_data.errors import check_positive_int


class SyntheticTokenDataset(Dataset[dict[str, torch.Tensor]]):
    """A reproducible random-token dataset for smoke tests and examples."""

    def __init__(
        self,
        num_samples: int = 10000,
        block_size: int = 128,
        vocab_size: int = 512,
        seed: int = 1234,
    ) -> None:
        for name, value in (
            ("num_samples", num_samples),
            ("block_size", block_size),
            ("vocab_size", vocab_size),
        ):
            check_positive_int("SyntheticTokenDataset", name, value)
        self.num_samples, self.block_size, self.vocab_size, self.seed = (
            num_samples,
            block_size,
            vocab_size,
            seed,
        )

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        index = operator.index(index)  # a NumPy or 0-d tensor index too, as a sampler may give
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"sample {index} out of range for {self.num_samples} samples")
        index %= self.num_samples
        # One generator per sample: sample i is the same whatever order, worker or process reads it.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.randint(0, self.vocab_size, (self.block_size + 1,), generator=generator)
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}


__all__ = ["SyntheticTokenDataset"]
