"""2.0 import path `speedtronic.data`: speedtronic_data's datasets and collation, and the 2.0
loader signature.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from speedtronic_data import (
    CharTokenizer,
    SyntheticTokenDataset,
    TextFileTokenDataset,
    collate_batch,
    collate_causal,
    infinite_batches,
)
from speedtronic_data import build_dataloader as _build_dataloader


def build_dataloader(
    config: Any,
    *,
    dataset: Dataset | IterableDataset | None = None,
    tokenizer: Any | None = None,
    pin_memory_device: bool = False,
    vocab_size: int | None = None,
) -> DataLoader:
    """Build the training loader; pin_memory_device=True pins memory unless data.pin_memory says
    otherwise (speedtronic_data.build_dataloader takes the target device instead).
    """
    return _build_dataloader(
        config,
        dataset=dataset,
        tokenizer=tokenizer,
        device="cuda" if pin_memory_device else None,
        vocab_size=vocab_size,
    )


__all__ = [
    "CharTokenizer",
    "SyntheticTokenDataset",
    "TextFileTokenDataset",
    "build_dataloader",
    "collate_batch",
    "collate_causal",
    "infinite_batches",
]
