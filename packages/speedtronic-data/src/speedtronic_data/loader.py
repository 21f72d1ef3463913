"""Resumable DataLoaders and the builders that turn a data config section into one."""

from __future__ import annotations

import dataclasses
import os
import pickle
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from speedtronic_config import DataConfig, RunConfig, resolve_section
from speedtronic_data.collate import collate_batch
from speedtronic_data.errors import DataError
from speedtronic_data.position import DataPosition, read_state
from speedtronic_data.shards import TokenShardDataset, resolve_shards
from speedtronic_data.synthetic import SyntheticTokenDataset
from speedtronic_data.text import TextFileTokenDataset
from speedtronic_data.tokenizer import CharTokenizer
from speedtronic_data.tokenizer_record import (
    BYTES,
    TokenizerRecord,
    load_tokenizer,
    record_for,
    shards_record,
)
from speedtronic_data.worker_errors import worker_original


class ResumableSampler(Sampler[int]):
    """Sequential or seeded-shuffled indices; epoch e's order depends only on (seed, e), never on
    global RNG. Under data parallelism every rank draws the same order and keeps every
    world_size-th index from its rank on, the tail cut so all ranks get the same count.
    """

    def __init__(
        self, size: int, shuffle: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0  # set by ResumableLoader before each pass

    def __iter__(self) -> Iterator[int]:
        share = len(self) * self.world_size  # whole rounds only: ranks must stay in step
        if not self.shuffle:
            order: Any = range(self.rank, share, self.world_size)
            return iter(order[self.start :])
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator)[self.rank : share : self.world_size]
        return _as_ints(order[self.start :])

    def __len__(self) -> int:
        return self.size // self.world_size  # this rank's full epoch; a resumed pass is shorter


def _as_ints(order: torch.Tensor, chunk: int = 1 << 12) -> Iterator[int]:
    # In chunks: a python list of every index of a large shard set would cost gigabytes.
    for begin in range(0, len(order), chunk):
        yield from order[begin : begin + chunk].tolist()


class ResumableLoader(DataLoader):
    """A DataLoader whose state_dict is (epoch, batches yielded) and whose next pass after
    load_state_dict yields exactly the batches that followed; each pass over it is the next epoch.

    The position lives in a DataPosition; a dataset that has one (TokenShardDataset) shares it, so
    the dataset's own state_dict/load_state_dict are the same position counted in samples.
    """

    def __init__(
        self,
        dataset: Dataset | IterableDataset,
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        **kwargs: Any,
    ) -> None:
        iterable = isinstance(dataset, IterableDataset)
        sampler = (
            None if iterable else ResumableSampler(len(dataset), shuffle, seed, rank, world_size)
        )
        self.rank, self.world_size = rank, world_size
        super().__init__(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            generator=torch.Generator().manual_seed(seed),
            **kwargs,
        )
        shared = getattr(dataset, "position", None)
        self.position = shared if isinstance(shared, DataPosition) else DataPosition()
        self.position.driven = True

    def _position(self, epoch: int, skip: int) -> int:
        """Point the sampler or dataset at sample `skip` of `epoch`; return the batches still to
        fast-forward.
        """
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.epoch, self.sampler.start = epoch, skip
            return 0
        if isinstance(self.dataset, TextFileTokenDataset):
            # Workers get a copy of the dataset when the pass starts, so set this first.
            self.dataset.start_block, self.dataset.batch_size = skip, self.batch_size
            self.dataset.rank, self.dataset.world_size = self.rank, self.world_size
            self.dataset.drop_last = self.drop_last
            return 0
        return (
            skip // self.batch_size
        )  # an unknown iterable dataset: replay it and drop the consumed batches

    def __iter__(self) -> Iterator[Any]:
        # A generator, so merely calling iter() (without drawing a batch) does not start an epoch.
        position = self.position
        epoch, skip = position.start_pass()
        replay = self._position(epoch, skip)
        iterator = super().__iter__()
        try:
            for _ in range(replay):  # a worker's error here too reads as without workers
                next(iterator, None)
            for batch in iterator:
                position.samples += self.batch_size
                yield batch
        except Exception as error:
            if self.num_workers:
                # Shut the workers down now. Left to the garbage collector with this traceback's
                # frames, torch's queue finalizers ran first and each worker waited out a 5 s join.
                traceback.clear_frames(error.__traceback__)
                del iterator
            original = worker_original(error)
            if original is None:
                raise
            # The worker's error as it would read without workers; its traceback follows it.
            raise original from error
        position.end_pass(epoch)

    def _data_size(self) -> tuple[int, str] | None:
        """Return the size of the data the position points into and its unit: a map-style
        dataset's samples, a streamed text file's bytes; None when unknown (an iterable Dataset).
        """
        if isinstance(self.sampler, ResumableSampler):
            return self.sampler.size, "samples"
        if isinstance(self.dataset, TextFileTokenDataset):
            return self.dataset.path.stat().st_size, "bytes of text"
        return None

    def state_dict(self) -> dict[str, Any]:
        """Return {"epoch", "batches", "samples"}: the pass in progress, how many of its batches
        were handed out and the samples they held (so a resume at another batch size continues
        at the same sample), plus "data_size" and its "data_unit" when the data's size is known
        (see _data_size) and "world_size" under data parallelism (the position counts this
        rank's share).
        """
        samples, size = self.position.samples, self.batch_size
        state = {"epoch": self.position.epoch, "batches": -(-samples // size), "samples": samples}
        known = self._data_size()
        if known is not None:
            state["data_size"], state["data_unit"] = known
        if self.world_size > 1:
            state["world_size"] = self.world_size
        return state

    def resumes_exactly(self, state: Any) -> bool:
        """Return True when load_state_dict(state) continues at the sample the state was saved at,
        whatever batch size it was saved under: the state counts samples, and this loader deals
        the data by sample (a sampler, or a text file in one process) or the samples fill whole
        batches of its size (ranks take a text file's blocks by turns of a batch; an unknown
        iterable dataset is replayed a batch at a time).
        """
        if not isinstance(state, dict) or not isinstance(state.get("samples"), int):
            return False  # it counts batches, of the size it was saved at
        if isinstance(self.sampler, ResumableSampler):
            return True
        if isinstance(self.dataset, TextFileTokenDataset) and self.world_size == 1:
            return True
        return state["samples"] % self.batch_size == 0

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next pass continue epoch state["epoch"] after state["samples"] samples (a
        state without them: after state["batches"] batches of this loader's batch size); warn
        when the data's size differs from the saved one, as the position then means nothing;
        DataError for a state saved at another world size.
        """
        epoch, batches = read_state(state, "batches", "ResumableLoader")
        saved_world = state.get("world_size", self.world_size)
        if saved_world != self.world_size:
            # Each rank's share is another slice of the data at another world size: the count
            # would skip and repeat windows unnoticed.
            raise DataError(
                f"loader state {state!r} counts a share of {saved_world} data-parallel ranks, "
                f"but this loader is one of {self.world_size}; resume at world size "
                f"{saved_world}, or start the epoch afresh (leave the state out)"
            )
        samples = batches * self.batch_size
        if "samples" in state:
            samples = read_state(state, "samples", "ResumableLoader")[1]
        known = self._data_size()
        if known is not None:
            # A state saved before data_unit was recorded counts in this loader's unit.
            saved = (state.get("data_size", known[0]), state.get("data_unit", known[1]))
            if saved != known:
                self._warn_data_changed(epoch, samples, saved, known)
        self.position.resume_at(epoch, samples, f"loader state {state!r}")

    @staticmethod
    def _warn_data_changed(
        epoch: int, samples: int, saved: tuple[int, str], known: tuple[int, str]
    ) -> None:
        """Warn that the data's size (or kind: samples, text) differs from the saved one."""
        if saved[1] == known[1]:
            held, why = f"{known[0]}", "its files (or data.block_size) changed since"
        else:  # e.g. synthetic samples then, a text file now
            held, why = f"{known[0]} {known[1]}", "the data changed kind since"
        warnings.warn(
            f"the saved data position (epoch {epoch}, {samples} samples in) was taken over "
            f"{saved[0]} {saved[1]}, but the data now holds {held}: {why}, so training does "
            "not continue where it stopped; resume on the data it was saved over, or start a "
            "new run",
            stacklevel=3,
        )


def loader_state(loader: Any) -> dict[str, Any]:
    """Return the resumable position of a ResumableLoader (what build_dataloader returns)."""
    if not isinstance(loader, ResumableLoader):
        raise DataError(
            "loader_state needs a ResumableLoader (from build_dataloader), got "
            f"{type(loader).__name__}"
        )
    return loader.state_dict()


def restore_loader(loader: Any, state: dict[str, int]) -> None:
    """Position loader so its next pass yields exactly the batches after the saved state."""
    if not isinstance(loader, ResumableLoader):
        raise DataError(
            "restore_loader needs a ResumableLoader (from build_dataloader), got "
            f"{type(loader).__name__}"
        )
    loader.load_state_dict(state)


def data_section(config: Any) -> DataConfig:
    """Return the typed data section of config (a whole config, a DataConfig, a mapping, an object
    with some of its fields, or None for the defaults); block_size must be resolved. A section
    built alone with no seed takes run.seed's default, as a whole config would give it.
    """
    section = resolve_section(config, "data")
    if section.block_size is None:
        raise DataError(
            "data.block_size is unset: set it, or build the section through SpeedtronicConfig "
            "(which takes it from model.max_seq_len)"
        )
    if section.seed is None:
        section = dataclasses.replace(section, seed=RunConfig.seed)
    return section


def _config_dataset(
    value: Any, block_size: int, vocab_size: int | None, trust_pickle: bool
) -> Dataset | IterableDataset:
    """Return the dataset data.dataset names: a Dataset object, a .bin shard glob, or a torch.save'd
    Dataset (unpickled only with data.trust_pickle: true).
    """
    if isinstance(value, (Dataset, IterableDataset)):
        return value
    if not isinstance(value, (str, os.PathLike)):  # str() of it would name no file
        raise DataError(
            f"data.dataset holds a {type(value).__name__}, not a torch Dataset or a path; give a "
            "Dataset object, a .bin shard glob, or a file written by torch.save(dataset)"
        )
    if str(value).endswith(".bin"):
        return TokenShardDataset(str(value), block_size, vocab_size, setting="data.dataset")
    path = Path(value)
    if not path.is_file():
        raise DataError(
            f"data.dataset = {str(value)!r} does not exist; give a Dataset object, a .bin shard "
            "glob, or a file written by torch.save(dataset)"
        )
    if not trust_pickle:
        raise DataError(
            f"data.dataset = {str(value)!r} is a pickled Dataset, and unpickling runs any code the "
            "file holds: set data.trust_pickle: true only if you wrote it yourself, or use token "
            "shards (data.shard_path)"
        )
    # A Dataset object cannot be loaded weights-only; the user vouched for this file.
    try:
        loaded = torch.load(path, weights_only=False)
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as error:
        raise DataError(
            f"data.dataset file {str(path)!r} is not one torch.save wrote "
            f"({type(error).__name__}: {error}); save the Dataset with torch.save(dataset, path), "
            "or set data.text_path for a text file"
        ) from None
    except (AttributeError, ImportError) as error:  # its class lives in a script not run here
        raise DataError(
            f"data.dataset file {str(path)!r} holds a class this process cannot import ({error}); "
            "define it in a module on the Python path, and save the Dataset again"
        ) from None
    if not isinstance(loaded, (Dataset, IterableDataset)):
        raise DataError(
            f"data.dataset file {str(path)!r} holds a {type(loaded).__name__}, not a torch Dataset"
        )
    return loaded


def select_dataset(
    config: Any, *, dataset: Any = None, tokenizer: Any = None, vocab_size: int | None = None
) -> Dataset | IterableDataset:
    """Return the training dataset: dataset=, then shard_path, text_path, data.dataset,
    synthetic.
    """
    if dataset is not None:
        return dataset
    section = data_section(config)
    block_size = section.block_size
    vocab = vocab_size if vocab_size is not None else section.vocab_size
    if section.shard_path is not None:
        return TokenShardDataset(section.shard_path, block_size, vocab)
    if section.text_path is not None:
        tok = tokenizer if tokenizer is not None else CharTokenizer(vocab)
        return TextFileTokenDataset(section.text_path, block_size, tok, vocab)
    if section.dataset is not None:
        return _config_dataset(section.dataset, block_size, vocab, section.trust_pickle)
    if section.synthetic:
        return SyntheticTokenDataset(section.num_tokens, block_size, vocab, section.seed)
    raise DataError(
        "no data source: set data.shard_path, data.text_path or data.dataset, "
        "or enable data.synthetic"
    )


def _shard_source(section: DataConfig) -> tuple[str, Any] | None:
    """Return (setting, glob) of the training shards, in select_dataset's order; None when the
    run trains on something else.
    """
    if section.shard_path is not None:
        return "data.shard_path", section.shard_path
    if section.text_path is None and isinstance(section.dataset, (str, Path)):
        if str(section.dataset).endswith(".bin"):
            return "data.dataset", section.dataset
    return None


def run_tokenizer(config: Any) -> TokenizerRecord:
    """Return the record of the tokenizer behind a data section's tokens: its training shards'
    record (data.shard_path, or a data.dataset shard glob), else the byte tokenizer (what text
    files and synthetic data use unless a tokenizer is passed in).
    """
    source = _shard_source(resolve_section(config, "data"))
    return BYTES if source is None else shards_record(resolve_shards(source[1], source[0]))


def _train_source(section: DataConfig, tokenizer: Any) -> tuple[str, TokenizerRecord] | None:
    """Return (setting, record) of what tokenized the training data (`tokenizer` for a text
    file); None for synthetic data or a Dataset object, whose tokenizer is unknown.
    """
    source = _shard_source(section)
    if source is not None:
        return source[0], run_tokenizer(section)
    if section.text_path is None:
        return None
    return "data.text_path", BYTES if tokenizer is None else record_for(tokenizer)


def training_tokenizer(config: Any, tokenizer: Any = None) -> TokenizerRecord | None:
    """Return the record of the tokenizer that wrote the training data (`tokenizer` for a text
    file, as build_dataloader takes it); None for synthetic data or a Dataset object.
    """
    source = _train_source(resolve_section(config, "data"), tokenizer)
    return None if source is None else source[1]


def _val_text_tokenizer(section: DataConfig, vocab: int | None) -> Any:
    """Return the training data's tokenizer for data.val_text_path, so both are tokenized alike."""
    record = run_tokenizer(section)
    if record.kind == "bytes":
        return CharTokenizer(vocab)
    if record.tokenizer_json is None:
        raise DataError(
            f"data.val_text_path cannot be tokenized like the training shards: they were written "
            f"by {record.describe()}, a Python tokenizer with no tokenizer.json; prepare the "
            "validation text with it and set data.val_shard_path instead"
        )
    return load_tokenizer(record)


def make_loader(
    config: Any,
    dataset: Dataset | IterableDataset,
    *,
    shuffle: bool,
    drop_last: bool,
    device: torch.device | str | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> ResumableLoader:
    """Return a ResumableLoader over dataset with the section's batch, worker and memory settings;
    memory is pinned by default when the batches go to a CUDA `device`. Under data parallelism
    (`world_size` > 1) rank `rank` gets its own, disjoint share of the data.
    """
    section = data_section(config)
    workers = section.num_workers
    prefetch = section.prefetch_factor if section.prefetch_factor is not None else 2
    pin = section.pin_memory
    if pin is None:
        pin = device is not None and torch.device(device).type == "cuda"
    return ResumableLoader(
        dataset,
        batch_size=section.micro_batch_size,
        shuffle=shuffle and not isinstance(dataset, IterableDataset),
        seed=section.seed,
        num_workers=workers,
        prefetch_factor=prefetch if workers > 0 else None,
        pin_memory=pin,
        drop_last=drop_last,
        collate_fn=collate_batch,
        rank=rank,
        world_size=world_size,
    )


def build_dataloader(
    config: Any,
    *,
    dataset: Dataset | IterableDataset | None = None,
    tokenizer: Any | None = None,
    device: torch.device | str | None = None,
    vocab_size: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """Build the training loader from a DataConfig (a ResumableLoader; dataset= takes
    precedence); `device` is where the batches will go (it decides pinned memory); `rank` of
    `world_size` data-parallel ranks reads its own share.
    """
    section = data_section(config)
    source = select_dataset(section, dataset=dataset, tokenizer=tokenizer, vocab_size=vocab_size)
    return make_loader(
        section,
        source,
        shuffle=section.shuffle,
        drop_last=section.drop_last,
        device=device,
        rank=rank,
        world_size=world_size,
    )


def _check_same_tokenizer(val: TokenizerRecord, train: tuple[str, TokenizerRecord] | None) -> None:
    """Raise DataError when the validation shards come from another tokenizer than the training
    data: their loss would measure nothing the model learned.
    """
    if train is None or val.encodes_alike(train[1]):
        return
    setting, record = train
    raise DataError(
        f"data.val_shard_path holds tokens of {val.describe()} but {setting} holds tokens of "
        f"{record.describe()}, so the validation loss would mean nothing; prepare both with one "
        "tokenizer (speedtronic prepare writes train_*.bin and val_*.bin together)"
    )


def build_eval_dataloader(
    config: Any,
    *,
    tokenizer: Any | None = None,
    device: torch.device | str | None = None,
    vocab_size: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader | None:
    """Build the validation loader from data.val_shard_path or data.val_text_path; None when
    neither is set. Validation text is tokenized like the training data (`tokenizer`, else the
    training shards' tokenizer); validation shards from another tokenizer are a DataError.
    """
    section = data_section(config)
    vocab = vocab_size if vocab_size is not None else section.vocab_size
    if section.val_shard_path is not None:
        shards = TokenShardDataset(
            section.val_shard_path, section.block_size, vocab, setting="data.val_shard_path"
        )
        _check_same_tokenizer(shards.tokenizer, _train_source(section, tokenizer))
        source: Dataset | IterableDataset = shards
    elif section.val_text_path is not None:
        tok = tokenizer if tokenizer is not None else _val_text_tokenizer(section, vocab)
        source = TextFileTokenDataset(
            section.val_text_path, section.block_size, tok, vocab, setting="data.val_text_path"
        )
    else:
        return None
    return make_loader(
        section,
        source,
        shuffle=False,
        drop_last=False,
        device=device,
        rank=rank,
        world_size=world_size,
    )


__all__ = [
    "ResumableLoader",
    "ResumableSampler",
    "build_dataloader",
    "build_eval_dataloader",
    "data_section",
    "loader_state",
    "make_loader",
    "restore_loader",
    "run_tokenizer",
    "select_dataset",
    "training_tokenizer",
]
