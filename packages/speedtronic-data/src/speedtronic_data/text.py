"""Stream a UTF-8 text file as causal token blocks with bounded memory."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from speedtronic_data.errors import DataError, check_positive_int
from speedtronic_data.partition import block_plan
from speedtronic_data.tokenizer import CharTokenizer, check_ids, encode_text, is_byte_tokenizer
from speedtronic_data.tokenizer_record import check_vocab, record_for

CHUNK_BYTES = 1 << 20  # read granularity: memory stays O(chunk + block) for any file size


def check_text_file(path: Path, setting: str = "data.text_path") -> Path:
    """Return path when it is a non-empty file, else raise DataError naming it and the setting
    (or argument) that gave it.
    """
    if path.is_dir():
        raise DataError(f"{setting} {str(path)!r} is a folder; point it at a UTF-8 text file")
    if not path.is_file():
        raise DataError(
            f"{setting} {str(path)!r} does not exist; point it at a UTF-8 text file "
            "(relative paths start at the working directory)"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{setting} {str(path)!r} is empty; point it at a file with text in it")
    return path


# Leading bytes of the compressed formats a text corpus often comes in.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
)


def iter_text_chunks(path: Path) -> Iterator[str]:
    """Yield the file's text in chunks of about CHUNK_BYTES that end on a line break where
    possible: a line longer than CHUNK_BYTES ends its chunk before the last run of spaces in a
    further CHUNK_BYTES, else mid-line.
    """
    with open(path, "rb") as handle:
        # utf-8-sig: a leading byte-order mark (Windows editors write one) is not text to train on.
        decoder = codecs.getincrementaldecoder("utf-8-sig")()
        offset, carry = 0, b""
        while True:
            raw, carry = carry + handle.read(CHUNK_BYTES), b""
            if raw:
                # End on a line so subword tokenizers see whole lines, but read at most a chunk
                # more: a file of one long line (text8 is 100 MB) would be held whole.
                rest = handle.readline(CHUNK_BYTES)
                raw += rest
                if len(rest) == CHUNK_BYTES and not rest.endswith(b"\n"):
                    # In the line's read part (never inside a UTF-8 sequence), so the carry stays
                    # about a chunk, and before the whole run of spaces, which a subword
                    # pre-tokenizer splits as one piece.
                    space = raw.rfind(b" ", len(raw) - len(rest))
                    while space > 0 and raw[space - 1 : space].isspace():
                        space -= 1
                    if space > 0:
                        raw, carry = raw[:space], raw[space:]
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as error:
                packed = next((name for magic, name in _COMPRESSED if raw.startswith(magic)), None)
                if offset == 0 and packed is not None:  # re-encoding would not help
                    raise DataError(
                        f"{str(path)!r} is a {packed} file, not text; decompress it first"
                    ) from None
                # The -sig decoder counts from after the byte-order mark it dropped.
                bom = len(codecs.BOM_UTF8) if offset == 0 and raw.startswith(codecs.BOM_UTF8) else 0
                raise DataError(
                    f"{str(path)!r} is not valid UTF-8 near byte {offset + bom + error.start}; "
                    "re-encode it as UTF-8"
                ) from None
            if text:
                yield text
            if not raw:
                return
            offset += len(raw)


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


__all__ = ["TextFileTokenDataset", "check_text_file", "iter_text_chunks"]
