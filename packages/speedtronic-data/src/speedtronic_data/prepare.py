"""Tokenize text into train/validation token shards, and assemble the offline stdlib corpus."""

from __future__ import annotations

import contextlib
import io
import math
import numbers
import os
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from speedtronic_config.atomic import new_folders_removed_on_error, probe_folder, unwritable_reason
from speedtronic_data.errors import DataError, check_positive_int
from speedtronic_data.records import RecordSource, is_record_source, open_records
from speedtronic_data.shards import write_shard
from speedtronic_data.text import (
    CHUNK_BYTES,
    check_text_file,
    iter_text_chunks,
    read_text_chunks,
)
from speedtronic_data.tokenizer import (
    CharTokenizer,
    as_json_tokenizer,
    check_ids,
    encode_text,
    is_byte_tokenizer,
)
from speedtronic_data.tokenizer_record import (
    RECORD_NAME,
    UNFINISHED_NAME,
    TokenizerRecord,
    check_tokenizer_copy,
    is_unfinished,
    mark_unfinished,
    write_record,
)

DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's shard size: 200 MB of uint16
# Between shard lines, how far the input is read is said this often: a default shard takes minutes
# with a subword tokenizer (about 400 s at 250,000 tokens/s).
PROGRESS_SECONDS = 30.0


@dataclass
class PrepareResult:
    """What prepare_shards wrote, which tokenizer wrote it and how long it took."""

    train_paths: list[Path] = field(default_factory=list)
    val_paths: list[Path] = field(default_factory=list)
    train_tokens: int = 0
    val_tokens: int = 0
    tokenizer: TokenizerRecord | None = None
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Return the tokens written (both splits) per second of preparation."""
        return (self.train_tokens + self.val_tokens) / max(self.seconds, 1e-9)


class _ShardWriter:
    """Accumulate tokens and write `{split}_{n:06d}.bin` shards of shard_tokens each."""

    def __init__(
        self, out_dir: Path, split: str, shard_tokens: int, report: Callable[[str], None]
    ) -> None:
        self.out_dir, self.split, self.shard_tokens, self.report = (
            out_dir,
            split,
            shard_tokens,
            report,
        )
        self.parts: list[np.ndarray] = []
        self.buffered, self.total, self.paths = 0, 0, []
        self.started = time.perf_counter()

    def add(self, ids: np.ndarray) -> None:
        while ids.size:
            take = min(ids.size, self.shard_tokens - self.buffered)
            self.parts.append(ids[:take])
            self.buffered += take
            ids = ids[take:]
            if self.buffered == self.shard_tokens:
                self.flush()

    def flush(self) -> None:
        if not self.buffered:
            return
        # The record is kept until a shard is replaced, so an input refused before that leaves
        # the folder as it was; from then on the folder is marked unfinished until it is written.
        mark_unfinished(self.out_dir)
        path = self.out_dir / f"{self.split}_{len(self.paths):06d}.bin"
        try:
            write_shard(path, np.concatenate(self.parts))
        except OSError as error:  # a full disk or quota, a file size limit: said alone, no path
            raise OSError(
                error.errno,
                f"cannot write token shard {path} ({error.strerror or error}); make room there "
                "or prepare into another folder, then run prepare again (it rebuilds the shards "
                "written so far)",
            ) from error
        self.paths.append(path)
        self.total += self.buffered
        rate = self.total / max(time.perf_counter() - self.started, 1e-9)
        self.report(
            f"wrote {path} ({self.buffered:,} tokens; {self.split} total {self.total:,}, "
            f"{rate:,.0f} tokens/s)"
        )
        self.parts, self.buffered = [], 0


class _Report:
    """Pass lines to progress and, when none came for PROGRESS_SECONDS, say how much of the input
    is read.
    """

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.started = self.last = time.perf_counter()

    def __call__(self, line: str) -> None:
        self.progress(line)
        self.last = time.perf_counter()

    def read(self, done: int, total: int, tokens: int) -> None:
        """Say done of total input bytes are read into tokens, if nothing was said for a while."""
        now = time.perf_counter()
        if now - self.last >= PROGRESS_SECONDS:
            rate = tokens / max(now - self.started, 1e-9)
            self(
                f"read {done / total:.0%} of the input ({done:,} of {total:,} bytes): "
                f"{tokens:,} tokens, {rate:,.0f} tokens/s"
            )


def _encode_chunk(tokenizer: Any, text: str, vocab_size: int | None, source: str) -> np.ndarray:
    """Return text's checked ids, as narrow as the vocabulary allows: a shard's tokens wait in
    memory until it is written, and as int64 a 100M-token shard took 800 MB, twice over while
    they were joined.
    """
    if is_byte_tokenizer(tokenizer):
        return _checked(np.frombuffer(text.encode("utf-8"), dtype=np.uint8), vocab_size, source)
    ids = _checked(np.asarray(encode_text(tokenizer, text), dtype=np.int64), vocab_size, source)
    return ids.astype(np.uint16 if vocab_size is not None and vocab_size <= 2**16 else np.uint32)


def _checked(ids: np.ndarray, vocab_size: int | None, source: str) -> np.ndarray:
    """Return ids once every one is in [0, vocab_size) (2**32 when the size is unknown)."""
    if ids.size:
        check_ids(ids, vocab_size if vocab_size is not None else 2**32, source)
    return ids


def _split_at_line(text: str, head_bytes: float, slack: float) -> tuple[str, str]:
    """Split text after the first line break at or past head_bytes (so no line is in both
    splits); when that is more than `slack` bytes away, at the last break before it within
    `slack`, else at head_bytes on a character boundary (one long line would otherwise put far
    more than head_bytes, or nothing, in the head).
    """
    if head_bytes <= 0:
        return "", text
    raw = text.encode("utf-8")
    if head_bytes >= len(raw):
        return text, ""
    target = int(head_bytes)
    after = raw.find(b"\n", target) + 1  # 0: none
    before = raw.rfind(b"\n", 0, target) + 1  # 0: none (a cut at 0 empties the head)
    if after and after - target <= slack:
        cut = after
    elif before and target - before <= slack:
        cut = before
    else:
        cut = target
        while cut > 0 and raw[cut] & 0xC0 == 0x80:
            cut -= 1
    return raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8")


def _chunks(text: str) -> Iterator[str]:
    """Yield text in pieces of about CHUNK_BYTES cut as a file's are (read_text_chunks): where a
    subword tokenizer splits anyway, so the pieces' ids are the text's.
    """
    return read_text_chunks(io.BytesIO(text.encode("utf-8")), "text")


def _text_pieces(
    size: int, chunks: Iterator[str], val_fraction: float
) -> Iterator[tuple[str, str, int]]:
    """Yield (split, text, bytes): the first val_fraction of the bytes (to a line break within
    half of that) is validation.
    """
    val_bytes, seen = val_fraction * size, 0
    for chunk in chunks:
        head, tail = _split_at_line(chunk, val_bytes - seen, slack=val_bytes / 2)
        length = len(chunk.encode("utf-8"))
        seen += length
        head_length = len(head.encode("utf-8"))
        for split, text, read in (
            ("val", head, head_length),
            ("train", tail, length - head_length),
        ):
            if text:
                yield split, text, read


def _record_pieces(source: RecordSource, val_fraction: float) -> Iterator[tuple[str, str, int]]:
    """Yield (split, text, bytes) runs of whole documents, each ending with a line break, and the
    input they were read from (a JSON Lines file's lines, not their text alone, so progress
    reaches the file's size): the first val_fraction of the rows (at least one, never all) are
    validation.
    """
    rows = source.num_rows
    val_rows = min(math.ceil(val_fraction * rows), rows - 1) if val_fraction > 0 and rows else 0
    parts: list[str] = []
    size, read, row, current = 0, 0, 0, "val" if val_rows else "train"
    for text, row_bytes in source.rows():
        if text is not None:
            split = "val" if row < val_rows else "train"
            if parts and (split != current or size >= CHUNK_BYTES):
                yield current, "".join(parts), read
                parts, size, read = [], 0, 0
            current, row = split, row + 1
            parts.append(text if text.endswith("\n") else text + "\n")
            size += len(parts[-1])
        read += row_bytes  # after the yield: a row's bytes go with the piece that holds it
    if parts:
        yield current, "".join(parts), read


@dataclass(frozen=True)
class _Source:
    """One input: its name, its size in bytes (for progress), its (split, text, bytes read)
    pieces and the files it reads (none for an in-memory text).
    """

    name: str
    size: int
    pieces: Callable[[float], Iterator[tuple[str, str, int]]]  # val_fraction -> pieces
    files: tuple[Path, ...] = ()


def _warn_repeats(sources: list[_Source]) -> None:
    """Warn once, before any tokenizing, of inputs that read a file an earlier one read (the same
    path, another spelling or link of it, a `datasets` folder again): each is tokenized again,
    which weighs its text that many times. That may be meant (to up-weight a source), so it is
    allowed; a shell glob that also matches a file named beside it is the usual accident.
    """
    first: dict[tuple[int, int], str] = {}  # (device, inode) -> the input that read it first
    repeats: dict[str, int] = {}  # that input -> how many times it is given
    for source in sources:
        files = {(stat.st_dev, stat.st_ino) for stat in (file.stat() for file in source.files)}
        earlier = next((first[file] for file in files if file in first), None)
        if earlier is not None:
            repeats[earlier] = repeats.get(earlier, 1) + 1
        for file in files:
            first.setdefault(file, source.name)
    if repeats:
        named = ", ".join(f"{name!r} ({count} times)" for name, count in repeats.items())
        warnings.warn(
            f"inputs given more than once are tokenized each time, so their text weighs that "
            f"many times in the shards: {named}; leave out the repeats unless that is meant",
            UserWarning,
            stacklevel=4,  # the caller of prepare_shards
        )


def _sources(text_paths: Iterable[str | Path], texts: Iterable[str], column: str) -> list[_Source]:
    """Return the inputs, each checked (there, readable, of a kind prepare reads) before any is
    tokenized: a refused one would otherwise cost the time spent on those before it.
    """
    sources: list[_Source] = []
    for item in text_paths:
        path = Path(item)
        if is_record_source(path):
            records = open_records(path, column)
            pieces = partial(_record_pieces, records)
            sources.append(_Source(str(path), records.approx_bytes, pieces, records.files))
            continue
        path = check_text_file(path, "input")
        size = path.stat().st_size
        sources.append(
            _Source(
                str(path),
                size,
                lambda f, p=path, n=size: _text_pieces(n, iter_text_chunks(p), f),
                (path,),
            )
        )
    for number, text in enumerate(texts):
        size = len(text.encode("utf-8"))
        sources.append(
            _Source(
                f"texts[{number}]", size, lambda f, t=text, n=size: _text_pieces(n, _chunks(t), f)
            )
        )
    _warn_repeats(sources)
    return sources


def _shards_in(out: Path) -> list[Path]:
    """Return the token shards in out, train shards first."""
    return sorted(out.glob("train_*.bin")) + sorted(out.glob("val_*.bin"))


@contextlib.contextmanager
def _mark_kept_only_with_shards(out: Path) -> Iterator[None]:
    """Yield; when the body raises and out holds no shard, remove its unfinished mark: a run
    stopped before its first shard landed (Ctrl-C, a full disk) has nothing to finish, and a
    folder it made would be left holding the mark alone.
    """
    try:
        yield
    except BaseException:
        # out may be no folder at all (a file on its path): the error raised is the one to tell.
        with contextlib.suppress(OSError):
            if not _shards_in(out):
                (out / UNFINISHED_NAME).unlink(missing_ok=True)
        raise


def _check_shards_are_ours(out: Path) -> None:
    """Raise DataError when out holds token shards that no prepare wrote (no record, no unfinished
    mark: llm.c's, a download), which preparing there would overwrite and delete.
    """
    if (out / RECORD_NAME).is_file() or is_unfinished(out):
        return
    found = _shards_in(out)
    if found:
        raise DataError(
            f"{str(out)!r} holds {len(found)} token shards ({found[0].name}, ...) that "
            f"prepare_shards did not write (no {RECORD_NAME}), and preparing there would "
            "overwrite and delete them; prepare into another folder, or move them out first"
        )


def prepare_shards(
    text_paths: Iterable[str | Path],
    out_dir: str | Path,
    tokenizer: Any | None = None,
    val_fraction: float = 0.05,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    *,
    texts: Iterable[str] = (),
    progress: Callable[[str], None] | None = print,
    text_column: str = "text",
    on_progress: Callable[[int, int, int], None] | None = None,
) -> PrepareResult:
    """Tokenize sources into train_*.bin / val_*.bin llm.c shards under out_dir, recording the
    tokenizer beside them (tokenizer_record.json, plus tokenizer.json for a `tokenizers` one).

    A source is a UTF-8 text file, an in-memory text, a Parquet or JSON Lines file, or a
    `datasets` save_to_disk folder (the records' text_column, one document after another). The
    first val_fraction of each source goes to validation (of its bytes, cut at a line break, for
    text; of its rows for records), the rest to training. Every shard is written atomically;
    shards left from an earlier, longer run are removed; shards prepare did not write (no record)
    are refused, never replaced. progress(line) gets a line per shard
    written and, when none came for PROGRESS_SECONDS, one saying how much of the input is read;
    on_progress(done_bytes, total_bytes, tokens) is called after each chunk (totals are estimates
    for Parquet). Arguments are checked before out_dir is created, and a refusal found in the data
    before any shard is written leaves no folder behind.
    """
    started = time.perf_counter()
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise DataError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    check_positive_int("prepare_shards", "shard_tokens", shard_tokens)
    if not str(out_dir):  # Path("") is the current folder, which would take the shards
        raise DataError("prepare_shards got an empty out_dir; name a folder for the shards")
    # One path or one text, not a list of them: iterating it would take each character as one.
    if isinstance(text_paths, (str, os.PathLike)):
        text_paths = [text_paths]
    if isinstance(texts, str):
        texts = [texts]
    tokenizer = as_json_tokenizer(tokenizer) if tokenizer is not None else CharTokenizer()
    vocab = getattr(tokenizer, "vocab_size", None)
    vocab = (
        tokenizer.get_vocab_size()
        if callable(getattr(tokenizer, "get_vocab_size", None))
        else vocab
    )
    sources = _sources(text_paths, texts, text_column)
    if not sources:
        raise DataError("prepare_shards got no text: pass text files or texts=[...]")
    out = Path(out_dir)
    check_tokenizer_copy(out, tokenizer)  # before any shard replaces the folder's old ones
    _check_shards_are_ours(out)
    # Bytes that are not UTF-8 or an id past the vocabulary refuse an input only once it is read:
    # the folders made for it go again while they are still empty.
    with new_folders_removed_on_error(out), _mark_kept_only_with_shards(out):
        try:
            probe_folder(out)  # before tokenizing: an unwritable out_dir fails now, not an hour in
        except OSError as error:
            raise DataError(
                f"cannot write shards into {str(out)!r} ({unwritable_reason(out, error)}); "
                "choose a writable folder"
            ) from None
        report = _Report(progress or (lambda line: None))
        writers = {
            split: _ShardWriter(out, split, shard_tokens, report) for split in ("train", "val")
        }
        total = sum(source.size for source in sources)
        done = tokens = 0
        for source in sources:
            for split, text, read in source.pieces(val_fraction):
                ids = _encode_chunk(tokenizer, text, vocab, source.name)
                writers[split].add(ids)
                done, tokens = done + read, tokens + ids.size
                if on_progress is not None:
                    on_progress(done, max(total, done), tokens)
                if progress is not None:
                    report.read(done, max(total, done), tokens)
        # Checked before any stale shard is removed: a refused run leaves an earlier run's
        # shards (a --val-fraction 0 folder holds train shards alone) where they were.
        if not (writers["train"].total or writers["train"].buffered):
            raise DataError(
                "prepare_shards produced no training tokens from "
                f"{[source.name for source in sources]}; "
                "lower val_fraction or add text"
            )
        # A folder asked for validation but holding none would fail `train` with
        # data.val_shard_path (no files match), and a CLI rerun would take it as unfinished.
        if val_fraction > 0 and not (writers["val"].total or writers["val"].buffered):
            raise DataError(
                f"prepare_shards produced no validation tokens from "
                f"{[source.name for source in sources]} (val_fraction {val_fraction} of each "
                "is under one byte, or of a one-document record file no row); add text, raise "
                "val_fraction (--val-fraction), or set it to 0 for no validation split"
            )
        for writer in writers.values():
            writer.flush()
            for stale in sorted(out.glob(f"{writer.split}_*.bin")):
                if stale not in writer.paths:
                    stale.unlink()
        result = PrepareResult(
            writers["train"].paths,
            writers["val"].paths,
            writers["train"].total,
            writers["val"].total,
        )
        result.tokenizer = write_record(out, tokenizer)
    result.seconds = time.perf_counter() - started
    return result


def stdlib_corpus(max_bytes: int | None = None) -> str:
    """Return the running Python's standard-library .py sources, sorted by path and joined, cut at
    max_bytes.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    if not files:
        raise DataError(
            f"no .py files under the standard library at {root} ({sys.executable}); "
            "pass your own text files to prepare_shards instead"
        )
    parts, size = [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test fixtures are deliberately not UTF-8
        piece = f"# {path.relative_to(root).as_posix()}\n{text}\n"
        encoded = piece.encode("utf-8")
        if max_bytes is not None and size + len(encoded) > max_bytes:
            parts.append(encoded[: max_bytes - size].decode("utf-8", errors="ignore"))
            break
        parts.append(piece)
        size += len(encoded)
    return "".join(parts)


__all__ = ["DEFAULT_SHARD_TOKENS", "PrepareResult", "prepare_shards", "stdlib_corpus"]
