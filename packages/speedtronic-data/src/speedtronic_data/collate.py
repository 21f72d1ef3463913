"""Turn lists of examples into the batch dict of the data contract, and cycle finite loaders."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from speedtronic_data.errors import DataError
from speedtronic_data.shards import WindowBatch


def collate_causal(batch: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack causal examples into {"input_ids", "labels": LongTensor[B, T], "attention_mask":
    BoolTensor[B, T]}.
    """
    if not batch:
        raise DataError(
            "collate_causal got an empty batch; check micro_batch_size and the dataset size"
        )
    if isinstance(batch, WindowBatch):  # token shards read a whole batch at once: nothing to stack
        rows, width = batch.input_ids.shape
        return {
            "input_ids": batch.input_ids,
            "labels": batch.labels,
            "attention_mask": torch.ones((rows, width), dtype=torch.bool),
        }
    missing = [key for key in ("input_ids", "labels") if key not in batch[0]]
    if missing:
        raise DataError(
            f"collate_causal needs input_ids and labels in every example; missing {missing} "
            f"(keys: {sorted(batch[0])}); pass your own collate_fn for other dictionaries"
        )
    input_ids = torch.stack([example["input_ids"] for example in batch]).long()
    labels = torch.stack([example["labels"] for example in batch]).long()
    if "attention_mask" in batch[0]:
        mask = torch.stack([example["attention_mask"] for example in batch]).bool()
    else:
        mask = torch.ones_like(input_ids, dtype=torch.bool)
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}


def collate_batch(batch: list[Any]) -> Any:
    """Collate causal dictionaries or homogeneous tuple/list examples (stacked field by field)."""
    if not batch:
        raise DataError(
            "collate_batch got an empty batch; check micro_batch_size and the dataset size"
        )
    if isinstance(batch, WindowBatch):
        return collate_causal(batch)
    first = batch[0]
    if isinstance(first, dict):
        return collate_causal(batch)
    if isinstance(first, (tuple, list)):
        if any(
            not isinstance(example, (tuple, list)) or len(example) != len(first)
            for example in batch
        ):
            raise DataError("collate_batch: tuple/list examples must all have the same length")
        return type(first)(default_collate(list(field)) for field in zip(*batch, strict=True))
    raise DataError(
        f"collate_batch cannot collate {type(first).__name__} examples; return causal dicts or "
        "tuples from the dataset, or build your own DataLoader with a collate_fn"
    )


def infinite_batches(loader: Iterable[Any]) -> Iterator[Any]:
    """Cycle a finite loader, making max-step runs independent of data size. One pass may be
    empty: the rest of an epoch a resumed loader had already finished (its state saved after the
    epoch's last batch); two in a row mean the loader yields nothing.
    """
    empty = 0
    while True:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        empty = 0 if produced else empty + 1
        if empty == 2:
            raise DataError(
                "the dataloader produced no batches; check the dataset size, micro_batch_size "
                "and drop_last"
            )


__all__ = ["collate_batch", "collate_causal", "infinite_batches"]
