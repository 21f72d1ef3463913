"""Stream a UTF-8 text file as causal token blocks with bounded memory."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.utils.data import IterableDataset

from speedtronic_data.errors import DataError, check_positive_int, not_a_file, unreadable
from speedtronic_data.partition import block_plan
from speedtronic_data.tokenizer import CharTokenizer, check_ids, encode_text, is_byte_tokenizer
from speedtronic_data.tokenizer_record import check_vocab, record_for

CHUNK_BYTES = 1 << 20  # read granularity: memory stays O(chunk + block) for any file size
HEAD_BYTES = 1 << 16  # what check_text_file reads of a file to see it is UTF-8 text


def check_text_file(path: Path, setting: str = "data.text_path") -> Path:
    """Return path when it is a non-empty file that can be read and starts as UTF-8 text, else
    raise DataError naming it and the setting (or argument) that gave it.
    """
    if path.is_dir():
        raise DataError(f"{setting} {str(path)!r} is a folder; point it at a UTF-8 text file")
    if (problem := not_a_file(path)) is not None:
        raise DataError(f"{setting} {str(path)!r} {problem}")
    if not path.is_file():
        raise DataError(
            f"{setting} {str(path)!r} does not exist; point it at a UTF-8 text file "
            "(relative paths start at the working directory)"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{setting} {str(path)!r} is empty; point it at a file with text in it")
    # Now, not when the file is reached: prepare would have tokenized every input before it. Its
    # head is checked too, which finds a compressed or otherwise encoded file at no cost.
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError as error:
        raise unreadable(f"{setting} {str(path)!r}", error) from None
    try:
        codecs.utf_8_decode(head, None, False)  # not final: a character the read cut is fine
    except UnicodeDecodeError as error:
        raise _not_utf8(str(path), head, error.start, at_start=True) from None
    return path


# Leading bytes of the compressed formats a text corpus often comes in.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
)


def _not_utf8(name: str, raw: bytes, at: int, *, at_start: bool) -> DataError:
    """Return the DataError for bytes that are not UTF-8 at byte `at` of the file name; raw is
    the bytes read, from the file's start when at_start (then a compressed file is named as one).
    """
    packed = next((kind for magic, kind in _COMPRESSED if raw.startswith(magic)), None)
    if at_start and packed is not None:  # re-encoding would not help
        return DataError(f"{name!r} is a {packed} file, not text; decompress it first")
    return DataError(f"{name!r} is not valid UTF-8 near byte {at}; re-encode it as UTF-8")


_ASCII_SPACES = frozenset(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")  # str.isspace's


def _is_space(char: bytes) -> bool:
    """Whether char, the UTF-8 bytes of one character (and maybe more after it), starts with
    whitespace; a character cut off or not UTF-8 counts as one, so no cut is made beside it.
    """
    if char[0] < 0x80:
        return char[0] in _ASCII_SPACES
    text = char.decode("utf-8", "ignore")[:1]
    return not text or text.isspace()


def _word_gap(raw: bytes, start: int) -> int:
    """Return where the last run of spaces in raw that ends at or after start and lies between two
    non-whitespace characters begins (never at 0), or -1.
    """
    end = len(raw) - 1  # the character after a space must be there
    while (space := raw.rfind(b" ", start, end)) >= 0:
        first = space
        while first > 0 and raw[first - 1] == 0x20:
            first -= 1
        before = first - 1  # back over UTF-8 continuation bytes to the character's first byte
        while before > 0 and first - before < 4 and raw[before] & 0xC0 == 0x80:
            before -= 1
        after = raw[space + 1 : space + 5]
        if first > 0 and not _is_space(raw[before:first]) and not _is_space(after):
            return first
        end = first
    return -1


def read_text_chunks(handle: BinaryIO, name: str, offset: int = 0) -> Iterator[str]:
    """Yield the UTF-8 text read from handle in chunks of about CHUNK_BYTES that end where a run
    of spaces between two words begins ("x| y", "x|   y"; never inside the spaces or a line's
    indentation); name and offset (where handle starts in it) place an error.

    A subword tokenizer encodes each chunk on its own, so a cut must fall where its pre-tokenizer
    splits whatever comes next and nothing joins across; there the chunks' ids are the whole
    text's. GPT-2's and Llama 3's byte-level regexes split before such a run and no piece reaches
    across it; Metaspace starts a word at the "▁" it becomes (and prepends none), and a normalizer
    that shortens runs of spaces sees the run whole. After a line break is not such a place: GPT-2
    joins the break to the next line's indentation ("\n   " then " x") or to the blank lines before
    it, Llama 3 to the punctuation before it, Metaspace to the word before it. A read without such
    a run is held for the next; 2 * CHUNK_BYTES without one end after their last line break, else
    there.
    """
    start, carry = offset, b""  # carry: read, not yet yielded; it starts at byte `offset`
    while True:
        read = handle.read(CHUNK_BYTES)
        raw = carry + read
        cut = _word_gap(raw, len(carry)) if read else len(raw)
        if cut < 0 and len(raw) >= 2 * CHUNK_BYTES:  # memory stays O(CHUNK_BYTES)
            cut = raw.rfind(b"\n") + 1 or len(raw)
        try:
            # From a view, not a slice: no copy of the chunk. A character that a cut at the end
            # of a read splits stays in carry.
            text, used = codecs.utf_8_decode(memoryview(raw)[: max(cut, 0)], None, not read)
        except UnicodeDecodeError as error:
            raise _not_utf8(name, raw, offset + error.start, at_start=offset == start) from None
        if text:
            yield text
        if not read:
            return
        if cut >= 0:
            offset, carry = offset + used, raw[used:]
        else:
            carry = raw


def iter_text_chunks(path: Path) -> Iterator[str]:
    """Yield the file's text in chunks of about CHUNK_BYTES, cut as read_text_chunks says."""
    with open(path, "rb") as handle:
        # A leading byte-order mark (Windows editors write one) is not text to train on.
        start = len(codecs.BOM_UTF8) if handle.read(3) == codecs.BOM_UTF8 else 0
        handle.seek(start)
        yield from read_text_chunks(handle, str(path), start)


def iter_token_chunks(path: Path, tokenizer: Any, vocab_size: int) -> Iterator[np.ndarray]:
    """Yield the file's token ids chunk by chunk, checked against vocab_size."""
    for text in iter_text_chunks(path):
        if is_byte_tokenizer(tokenizer):
            # UTF-8 bytes are the byte tokenizer's ids: skip the list-of-int round trip.
            ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        else:
            ids = np.asarray(encode_text(tokenizer, text), dtype=np.int64)
        if ids.size:
            # Bytes always fit a vocabulary of 256 or more.
            if ids.dtype != np.uint8 or vocab_size < 256:
                check_ids(ids, vocab_size, str(path))
            yield ids


def iter_blocks(chunks: Iterator[np.ndarray], block_size: int) -> Iterator[np.ndarray]:
    """Yield windows of block_size + 1 tokens at stride block_size: every transition is a label
    once.
    """
    buffer = np.zeros(0, dtype=np.int64)
    for chunk in chunks:
        buffer = np.concatenate([buffer, chunk.astype(np.int64)])
        starts = range(0, len(buffer) - block_size, block_size)
        for start in starts:
            yield buffer[start : start + block_size + 1]
        buffer = buffer[len(starts) * block_size :]


class TextFileTokenDataset(IterableDataset[dict[str, torch.Tensor]]):
    """Stream a text file in fixed-size token blocks.

    tokenizer may be a callable or an object with encode. The file is read incrementally, one chunk
    of about CHUNK_BYTES at a time; examples are read-only-by-convention views of that chunk
    (collation copies them), so copy an example before writing into it.
    """

    def __init__(
        self,
        path: str | Path,
        block_size: int,
        tokenizer: Callable[[str], Any] | Any | None = None,
        vocab_size: int = 256,
        *,
        setting: str = "data.text_path",
    ) -> None:
        check_positive_int("TextFileTokenDataset", "block_size", block_size)
        check_positive_int("TextFileTokenDataset", "vocab_size", vocab_size)
        self.path = check_text_file(Path(path), setting)
        self.block_size, self.vocab_size = block_size, vocab_size
        self.tokenizer = tokenizer if tokenizer is not None else CharTokenizer(vocab_size)
        record = record_for(self.tokenizer)
        if record.kind != "bytes":  # bytes below a cut vocabulary are checked as they are read
            # Now, not at the first id past it: a worker would raise it inside a traceback.
            subject = f"{setting} {str(self.path)!r} is tokenized by"
            check_vocab(record, vocab_size, subject, "tokenize it with")
        if is_byte_tokenizer(self.tokenizer) and self.path.stat().st_size <= block_size:
            raise DataError(self._too_short(self.path.stat().st_size))
        # Set by ResumableLoader: blocks before start_block are skipped; workers take whole batches
        # in turn.
        self.start_block, self.batch_size = 0, 1
        # Set by ResumableLoader under data parallelism.
        self.rank, self.world_size, self.drop_last = 0, 1, False

    def _round_gate(self, index: int) -> tuple[int, int]:
        """Return the round of block `index` and the block whose arrival shows that every rank
        gets a batch of that round: the round's last block under drop_last, else the first block
        of the last rank's batch. One process has rounds of one batch and no gate to wait for.
        """
        if self.world_size == 1:
            return index, index
        batch = self.batch_size
        round_ = index // (batch * self.world_size)
        first_of_last = (round_ * self.world_size + self.world_size - 1) * batch
        return round_, first_of_last + batch - 1 if self.drop_last else first_of_last

    def _too_short(self, tokens: int) -> str:
        return (
            f"{str(self.path)!r} holds {tokens} tokens, fewer than block_size + 1 = "
            f"{self.block_size + 1}; "
            "lower data.block_size (model.max_seq_len) or use a longer file"
        )

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        plan = block_plan(self.start_block, self.batch_size, self.rank, self.world_size)
        blocks = iter_blocks(
            iter_token_chunks(self.path, self.tokenizer, self.vocab_size), self.block_size
        )
        # Ranks take batches in turn, a round of world_size at a time. A rank yields a round's
        # blocks only once the stream shows that every rank gets its batch of that round (a
        # whole one under drop_last), so every rank has the same batches an epoch: one with an
        # extra batch would start its next epoch a step later and the others would repeat
        # their shares more often.
        released, held = -1, []  # the last round every rank gets; this rank's blocks waiting
        index = -1
        for index, block in enumerate(blocks):
            if plan.owns(index):
                # Views, no copy: blocks are slices of a buffer that is never written after it is
                # built (so holding them back is safe too).
                inputs, labels = torch.from_numpy(block[:-1]), torch.from_numpy(block[1:])
                held.append({"input_ids": inputs, "labels": labels})
            round_, gate = self._round_gate(index)
            released = round_ if index == gate else released
            if round_ <= released:
                yield from held
                held.clear()
        if index < 0:
            raise DataError(
                self._too_short(
                    sum(
                        len(c)
                        for c in iter_token_chunks(self.path, self.tokenizer, self.vocab_size)
                    )
                )
            )


__all__ = ["TextFileTokenDataset", "check_text_file", "iter_text_chunks", "read_text_chunks"]
