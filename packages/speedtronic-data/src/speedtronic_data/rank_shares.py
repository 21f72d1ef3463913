"""Before the first step: refuse data that leaves some rank (or the one process) without a batch.

The answer depends only on the data's size, the batch and the world size, so every rank (and the
launcher, before any worker starts) reaches it alike, instead of one rank failing or waiting at
its first step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speedtronic_config.errors import describe_ranks, on_every_rank
from speedtronic_data.errors import DataError
from speedtronic_data.loader import ResumableLoader, ResumableSampler
from speedtronic_data.text import TextFileTokenDataset
from speedtronic_data.tokenizer import is_byte_tokenizer


def _blocks_and_tokens(loader: ResumableLoader) -> tuple[int, int | None] | None:
    """Return (blocks in one epoch, tokens) of the loader's data; None when unknown without
    reading it all (a streamed file through a tokenizer, an iterable Dataset object).
    """
    dataset = loader.dataset
    if isinstance(loader.sampler, ResumableSampler):
        return loader.sampler.size, getattr(dataset, "num_tokens", None)
    if isinstance(dataset, TextFileTokenDataset) and is_byte_tokenizer(dataset.tokenizer):
        tokens = dataset.path.stat().st_size  # a byte per token
        return max(0, (tokens - 1) // dataset.block_size), tokens
    return None


def _fewest_batches(
    blocks: int, batch_size: int, world_size: int, drop_last: bool, sized: bool
) -> int:
    """Return the batches of the rank with the fewest, as ResumableSampler (sized data: an equal
    share of blocks each) or block_plan (streamed data: batch g to rank g % world) deal them.
    """
    if sized:
        share = blocks // world_size
        return share // batch_size if drop_last else -(-share // batch_size)
    batches = blocks // batch_size if drop_last else -(-blocks // batch_size)
    return batches // world_size


def rank_share_problem(loader: Any, what: str) -> str | None:
    """Return one line saying why some rank of the loader's world gets no batch of `what`
    (training or validation) data, or None when every rank gets one (or it cannot be told).
    """
    if not isinstance(loader, ResumableLoader):
        return None
    known = _blocks_and_tokens(loader)
    if known is None:
        return None
    blocks, tokens = known
    world, batch = loader.world_size, loader.batch_size
    sized = isinstance(loader.sampler, ResumableSampler)
    if _fewest_batches(blocks, batch, world, loader.drop_last, sized) > 0:
        return None
    block = getattr(loader.dataset, "block_size", None)
    held = f"{blocks:,} block{'s' if blocks != 1 else ''}" + (f" of {block}" if block else "")
    held = f"{tokens:,} tokens ({held})" if tokens is not None else held
    step = f"{batch} x {block} = {batch * block:,} tokens" if block else f"{batch} blocks"
    if world == 1:
        return (
            f"the {what} data holds {held}, too few for one batch of {step} "
            "(data.micro_batch_size x model.max_seq_len); use a smaller data.micro_batch_size or "
            "model.max_seq_len, or more data"
        )
    return (
        f"the {what} data holds {held}, too few for {world} data-parallel ranks: each rank needs "
        f"at least one batch of {step} (data.micro_batch_size x model.max_seq_len); use fewer "
        "processes (--nproc-per-node), a smaller data.micro_batch_size or model.max_seq_len, or "
        "more data"
    )


def check_rank_shares(
    training: Any, validation: Any = None, gather: Callable[[Any], list[Any]] = lambda x: [x]
) -> None:
    """Raise DataError when some rank's share of the training or validation loader holds no
    batch; `gather` (a group's all_gather_object) makes every rank raise when any rank would.
    """
    problem = rank_share_problem(training, "training") or rank_share_problem(
        validation, "validation"
    )
    # Each rank read the sizes itself: ranks that see different files still decide as one.
    answers = gather((problem, [_size(training), _size(validation)]))
    problem = next((found for found, _ in answers if found is not None), None)
    if problem is None:
        problem = _sizes_apart([sizes for _, sizes in answers])
    if problem is not None:
        raise on_every_rank(DataError(problem))  # gathered: every rank raises this alike


def _size(loader: Any) -> int | None:
    """Return the blocks of a loader's data (what its ranks' shares are dealt from), None when
    unknown or there is no loader.
    """
    known = _blocks_and_tokens(loader) if isinstance(loader, ResumableLoader) else None
    return None if known is None else known[0]


def _sizes_apart(sizes: list[list[int | None]]) -> str | None:
    """Return one line naming the data whose size differs between ranks (each rank's [training,
    validation] sizes), else None. Nodes with different copies of the data would deal
    overlapping, unequal shares from different seeded orders, without a word.
    """
    for index, what in enumerate(("training", "validation")):
        seen = [rank_sizes[index] for rank_sizes in sizes]
        if len(set(seen)) == 1:
            continue
        held = describe_ranks(["unknown" if size is None else f"{size:,} blocks" for size in seen])
        return (
            f"the {what} data differs between ranks ({held}): each node reads its own copy, and "
            "ranks would train on overlapping, unequal shares; give every node the same data"
        )
    return None


__all__ = ["check_rank_shares", "rank_share_problem"]
