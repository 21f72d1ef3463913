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
    _check_lengths(batch)
    input_ids = torch.stack([example["input_ids"] for example in batch]).long()
    labels = torch.stack([example["labels"] for example in batch]).long()
    # An example without a mask is all true, whichever examples of the batch carry one.
    masks = [example.get("attention_mask") for example in batch]
    if all(mask is None for mask in masks):
        mask = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        ones = torch.ones(input_ids.shape[1:], dtype=torch.bool)
        mask = torch.stack([ones if m is None else torch.as_tensor(m).bool() for m in masks])
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}


def _check_lengths(batch: Sequence[dict[str, Any]]) -> None:
    """Raise DataError unless every example has as many labels (and mask entries) as input ids,
    and as many as the first example: examples are stacked, not padded.
    """
    length = len(batch[0]["input_ids"])
    for number, example in enumerate(batch):
        for key in ("input_ids", "labels", "attention_mask"):
            if key in example and len(example[key]) != length:
                raise DataError(
                    f"collate_causal: example {number} has {len(example[key])} {key} but example "
                    f"0 has {length} input_ids; it stacks equal-length examples with one label per "
                    "input position: pad them in the dataset (labels -100 and attention_mask "
                    "false at the pads) or pass your own collate_fn"
                )


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
