"""llm.c / modded-nanogpt token shards: the on-disk format and a memory-mapped window dataset."""

from __future__ import annotations

import bisect
import glob
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided
from torch.utils.data import Dataset

from speedtronic_config.atomic import atomic_write
from speedtronic_data.errors import DataError, check_positive_int
from speedtronic_data.map_cache import MapCache
from speedtronic_data.position import DataPosition, read_state
from speedtronic_data.tokenizer_record import check_vocab, shards_record

HEADER_INTS = 256  # the header is 256 little-endian int32s: magic, version, token count, then zeros
HEADER_BYTES = HEADER_INTS * 4
# Our own slot, which llm.c's readers ignore and its writers leave zero: the largest token id + 1,
# read as uint32, so 0 means "unknown" (written elsewhere, or a uint32 shard holding 2**32 - 1).
MAX_TOKEN_SLOT = 3
FORMATS = {
    20240520: (1, np.dtype("<u2")),
    20240801: (7, np.dtype("<u4")),
}  # magic -> (version, token dtype)
# Shards a dataset keeps mapped at once: well under vm.max_map_count (65530 by default), yet as
# many as 800B tokens in 100M-token shards take, so a map is rarely closed and opened again. Each
# map holds a file descriptor, so a quarter of the open-file limit caps it where that is lower.
MAX_OPEN_SHARDS = 8192


@dataclass(frozen=True)
class ShardInfo:
    """A validated shard: where it is, its token dtype, how many tokens it holds and its largest
    token id as the header records it (None when the header does not say).
    """

    path: Path
    dtype: np.dtype
    num_tokens: int
    max_token: int | None = None


def read_shard_header(path: str | Path) -> ShardInfo:
    """Return the shard's header after checking magic, version and that the body is complete."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"token shard {str(path)!r} does not exist; run `speedtronic prepare` or fix "
            "data.shard_path"
        )
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataError(
            f"token shard {str(path)!r} is {size} bytes, shorter than its {HEADER_BYTES}-byte "
            "header; "
            "the file is truncated: write it again"
        )
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, num_tokens = int(header[0]), int(header[1]), int(header[2])
    if magic not in FORMATS:
        raise DataError(
            f"token shard {str(path)!r} has magic {magic}, not an llm.c shard "
            f"(expected one of {sorted(FORMATS)}); write it with prepare_shards or write_shard"
        )
    expected_version, dtype = FORMATS[magic]
    if version != expected_version:
        raise DataError(
            f"token shard {str(path)!r} has version {version}; magic {magic} needs version "
            f"{expected_version}: write it again with prepare_shards"
        )
    body = size - HEADER_BYTES
    if num_tokens < 0 or body != num_tokens * dtype.itemsize:
        raise DataError(
            f"token shard {str(path)!r} header promises {num_tokens} tokens "
            f"({num_tokens * dtype.itemsize} bytes) but the body has {body} bytes; the file is "
            "truncated or corrupt: write it again"
        )
    recorded = int(header.view("<u4")[MAX_TOKEN_SLOT])
    if recorded - 1 > np.iinfo(dtype).max:
        raise DataError(
            f"token shard {str(path)!r} header records largest token id {recorded - 1}, more than "
            f"its {dtype.name} tokens can hold; the header is corrupt: write it again"
        )
    return ShardInfo(path, dtype, num_tokens, recorded - 1 if recorded else None)


def read_shard_tokens(path: str | Path) -> np.ndarray:
    """Return the shard's tokens as a read-only numpy memmap (uint16 or uint32)."""
    return _memmap(read_shard_header(path))


def _memmap(shard: ShardInfo) -> np.ndarray:
    """Return a shard's tokens mapped shared and read-only: the page cache's own pages, charged
    to no process (an empty array for an empty shard, which cannot be mapped).
    """
    if shard.num_tokens == 0:
        return np.zeros(0, dtype=shard.dtype)
    return np.memmap(
        shard.path, dtype=shard.dtype, mode="r", offset=HEADER_BYTES, shape=(shard.num_tokens,)
    )


def open_shard_limit(shards: int = MAX_OPEN_SHARDS) -> int:
    """Return how many of `shards` shards a dataset keeps mapped at once: MAX_OPEN_SHARDS, or a
    quarter of the process's soft open-file limit (at least 16) where that is lower; the rest of
    the limit stays for the process's other files and datasets. Where the soft limit is too low
    for every shard, it is first raised toward the hard one, as `ulimit -n` would.
    """
    try:
        import resource  # POSIX only
    except ImportError:
        return MAX_OPEN_SHARDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * min(shards, MAX_OPEN_SHARDS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):  # a platform that refuses it: work within the limit
                pass
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_SHARDS
    return min(MAX_OPEN_SHARDS, max(16, soft // 4))


def _map_tokens(shard: ShardInfo) -> np.ndarray:
    """Return a validated shard's tokens as a read-only map; DataError when the file changed since
    it was validated.
    """
    size = HEADER_BYTES + shard.num_tokens * shard.dtype.itemsize
    try:
        changed = shard.path.stat().st_size != size  # a stat: reopening is on the read path
    except OSError:
        changed = True
    if changed:
        now = read_shard_header(shard.path)  # a DataError naming what is wrong with it now
        raise DataError(
            f"token shard {str(shard.path)!r} changed while it was being read: it held "
            f"{shard.num_tokens} tokens, now {now.num_tokens}; prepare new shards into another "
            "folder, or restart on the rewritten ones"
        )
    # Not a private map (torch.from_file), which holds no descriptor but commits the whole file:
    # a host that does not overcommit memory refuses it. A plain ndarray view: indexing a
    # np.memmap costs more than the read itself.
    return _memmap(shard).view(np.ndarray)


def write_shard(path: str | Path, tokens: Any) -> Path:
    """Write tokens atomically as one shard: uint16 (magic 20240520) when every id fits, else
    uint32; the header records the largest id.
    """
    path = Path(path)
    ids = np.asarray(tokens)
    if ids.ndim != 1:
        raise DataError(f"write_shard needs a 1-D array of token ids, got shape {ids.shape}")
    low, high = (int(ids.min()), int(ids.max())) if ids.size else (0, -1)
    if low < 0 or high >= 2**32:
        raise DataError(f"write_shard: token ids must lie in [0, 2**32), got [{low}, {high}]")
    magic = 20240520 if high < 2**16 else 20240801
    version, dtype = FORMATS[magic]
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (magic, version, ids.size)
    header.view("<u4")[MAX_TOKEN_SLOT] = (high + 1) % 2**32  # 2**32 - 1 wraps to 0: "unknown"

    def write(handle: IO[bytes]) -> None:
        handle.write(header.tobytes())
        # From the array's own memory: tobytes() made one more copy of the whole shard.
        handle.write(memoryview(np.ascontiguousarray(ids, dtype=dtype)).cast("B"))

    return atomic_write(path, write)


def _check_shard_vocab(shard: ShardInfo, vocab_size: int | None) -> None:
    """Raise DataError when a shard holds a token id >= vocab_size, so a bad id fails at start-up,
    not when its batch is read: the header's recorded largest id, else one max over the memmap.
    """
    if vocab_size is None or shard.num_tokens == 0 or int(np.iinfo(shard.dtype).max) < vocab_size:
        return  # e.g. a uint16 shard under a vocabulary of 65536 cannot hold one
    # Scanning reads the whole shard, on every rank at every start (20 GB for FineWeb 10B), so
    # only shards whose header does not record their largest id pay for it.
    largest = shard.max_token
    if largest is None:
        largest = int(read_shard_tokens(shard.path).max())
    if largest >= vocab_size:
        raise DataError(
            f"token shard {str(shard.path)!r} holds token id {largest} >= vocab_size "
            f"{vocab_size}; raise model.vocab_size to at least {largest + 1} or prepare the "
            "shards with a tokenizer of that size"
        )


def resolve_shards(
    pattern: str | Path | list[str | Path], setting: str = "data.shard_path"
) -> list[Path]:
    """Return the sorted shard files matching a glob (or list of paths/globs); DataError when none
    match.
    """
    patterns = pattern if isinstance(pattern, (list, tuple)) else [pattern]
    folders = [str(item) for item in patterns if Path(item).is_dir()]
    if folders:
        raise DataError(
            f"{setting} = {folders[0]!r} is a folder; give a glob of its shards, e.g. "
            f"{str(Path(folders[0]) / 'train_*.bin')!r}"
        )
    paths = sorted({Path(p) for item in patterns for p in (glob.glob(str(item)) or [])})
    if not paths:
        raise DataError(
            f"{setting} = {pattern!r} matches no files; run `speedtronic prepare OUT_DIR` "
            "(or prepare_shards) first, or fix the glob"
        )
    return paths


class TokenShardDataset(Dataset[dict[str, torch.Tensor]]):
    """Causal windows of block_size + 1 tokens over llm.c shards, read through memory maps.

    Window i of a shard starts at token i * block_size; windows never cross shard boundaries.
    Shards are mapped when first read, at most open_shard_limit() at once (the least recently
    read is unmapped first), so a corpus of any shard count opens.
    Shuffle it with a sampler (build_dataloader does, seeded) for random windows; iterate in index
    order for sequential ones. A DataLoader asks for a whole batch at once (__getitems__), which is
    one slice or one gather per batch. state_dict()/load_state_dict() are its position in the
    loader's order, kept by the ResumableLoader that build_dataloader wraps it in (the loader shares
    `position` and advances it per batch handed out); load_state_dict may come before or after the
    loader is built.
    """

    def __init__(
        self,
        paths: str | Path | list[str | Path],
        block_size: int,
        vocab_size: int | None = None,
        *,
        setting: str = "data.shard_path",
    ) -> None:
        check_positive_int("TokenShardDataset", "block_size", block_size)
        if vocab_size is not None:
            check_positive_int("TokenShardDataset", "vocab_size", vocab_size)
        self.block_size, self.vocab_size = block_size, vocab_size
        self.shards = [read_shard_header(p) for p in resolve_shards(paths, setting)]
        # Which tokenizer wrote them (tokenizer_record.json beside the shards): a vocabulary too
        # small for it fails here, in one line, not at the first out-of-range id mid-epoch.
        self.tokenizer = shards_record(s.path for s in self.shards)
        folder = self.shards[0].path.parent
        check_vocab(self.tokenizer, vocab_size, f"token shards in {folder} were written by")
        windows = [max(0, (s.num_tokens - 1) // block_size) for s in self.shards]
        self.offsets = np.concatenate([[0], np.cumsum(windows)]).astype(
            np.int64
        )  # first window of each shard
        if self.offsets[-1] == 0:
            largest = max(s.num_tokens for s in self.shards)
            raise DataError(
                f"token shards {[str(s.path) for s in self.shards][:3]} hold at most {largest} "
                "tokens "
                f"each, fewer than block_size + 1 = {block_size + 1}; lower data.block_size "
                "(model.max_seq_len) or prepare more text"
            )
        self._bounds = (
            self.offsets.tolist()
        )  # python ints: bisect on them is cheaper than numpy per batch
        self.position = DataPosition()
        for shard in self.shards:
            _check_shard_vocab(shard, vocab_size)
        self._maps = MapCache(open_shard_limit(len(self.shards)))

    @property
    def num_tokens(self) -> int:
        """Total tokens across the shards."""
        return sum(s.num_tokens for s in self.shards)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _open(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Return a shard's (tokens, windows): its mapped tokens and a [num_windows,
        block_size + 1] view.
        """
        tokens = _map_tokens(self.shards[shard])
        count, step = max(0, (len(tokens) - 1) // self.block_size), tokens.itemsize
        # Row i is window i (a strided view, no copy): fancy-indexing rows gathers a batch without
        # index math.
        rows = as_strided(
            tokens, (count, self.block_size + 1), (self.block_size * step, step), writeable=False
        )
        return tokens, rows

    def _one_shard(self, shard: int, local: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Return (inputs, labels) views of windows `local` of one shard: a slice when they are
        consecutive.
        """
        (tokens, rows), block, first = self._maps.get(shard, self._open), self.block_size, local[0]
        if local == list(range(first, first + len(local))):
            # Consecutive windows overlap by one token: they are one contiguous run, no gather
            # needed.
            run = tokens[first * block : (first + len(local)) * block + 1]
            return run[:-1].reshape(-1, block), run[1:].reshape(-1, block)
        windows = rows[local]
        return windows[:, :-1], windows[:, 1:]

    def batch(self, indices: Any) -> WindowBatch:
        """Return the windows at indices as a WindowBatch of LongTensor[len(indices), block_size]
        inputs and labels.
        """
        # A list (what DataLoader passes): for one batch of indices, list operations cost less than
        # numpy calls.
        if not isinstance(indices, list):
            indices = np.asarray(indices, dtype=np.int64).reshape(-1).tolist()
        if not indices:
            raise IndexError("TokenShardDataset.batch needs at least one window index")
        low, high = min(indices), max(indices)
        if low < 0 or high >= len(self):
            raise IndexError(
                f"window index {low if low < 0 else high} out of range for {len(self)} windows"
            )
        first = bisect.bisect_right(self._bounds, low) - 1
        if high < self._bounds[first + 1]:  # the common case: every window in one shard
            base = self._bounds[first]
            inputs, labels = self._one_shard(
                first, [i - base for i in indices] if base else indices
            )
        else:
            shard_of = np.searchsorted(self.offsets, indices, side="right") - 1
            inputs = np.empty((len(indices), self.block_size), dtype=np.int64)
            labels = np.empty_like(inputs)
            for shard in np.unique(shard_of).tolist():
                rows = np.nonzero(shard_of == shard)[0]
                local = [indices[r] - self._bounds[shard] for r in rows.tolist()]
                inputs[rows], labels[rows] = self._one_shard(shard, local)
        # One cast each, straight into contiguous int64: the only copies of the batch's tokens.
        return WindowBatch(
            torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)),
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += len(self)
        return self.batch([index])[0]

    def __getitems__(self, indices: list[int]) -> WindowBatch:
        # DataLoader calls this with a whole batch of indices: one read instead of one per example.
        return self.batch(indices)

    @property
    def state_dict(self) -> Callable[[], dict[str, int]]:
        """The position method, present only while a ResumableLoader drives the dataset
        (AttributeError otherwise).

        Under a plain DataLoader nothing counts the batches handed out, so there is no position to
        save; hiding the method makes the trainer's BatchStream fall back to replaying the loader
        instead of trusting it.
        """
        if not self.position.driven:
            raise AttributeError(
                "TokenShardDataset.state_dict exists only while a ResumableLoader drives the "
                "dataset "
                "(build_dataloader(config, dataset=ds)); a plain DataLoader does not count batches"
            )
        return self._position_state

    def _position_state(self) -> dict[str, int]:
        """Return {"epoch", "windows", "num_windows"}: the epoch in progress and the windows of it
        handed out.
        """
        return {
            "epoch": self.position.epoch,
            "windows": min(self.position.samples, len(self)),
            "num_windows": len(self),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next pass of the loader over this dataset continue after state["windows"]
        windows.
        """
        epoch, windows = read_state(state, "windows", "TokenShardDataset")
        saved = state.get("num_windows", len(self))
        if saved != len(self):
            raise DataError(
                f"TokenShardDataset state was saved over {saved} windows but these shards hold "
                f"{len(self)} (block_size {self.block_size}); resume with the same data.shard_path "
                "and block_size"
            )
        self.position.resume_at(epoch, windows, "TokenShardDataset state")


class WindowBatch(Sequence):
    """A batch of causal windows already read into LongTensor[B, T] inputs and labels;
    collate_causal uses them.
    """

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.input_ids, self.labels = input_ids, labels

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: Any) -> dict[str, torch.Tensor]:
        # Per-example access, for a plain DataLoader with default_collate.
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}


__all__ = [
    "ShardInfo",
    "TokenShardDataset",
    "WindowBatch",
    "read_shard_header",
    "read_shard_tokens",
    "resolve_shards",
    "write_shard",
]
