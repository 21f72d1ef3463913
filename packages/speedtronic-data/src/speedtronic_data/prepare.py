"""Tokenize text into train/validation token shards, and assemble the offline stdlib corpus."""

from __future__ import annotations

import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speedtronic_data.errors import DataError
from speedtronic_data.shards import write_shard
from speedtronic_data.text import CHUNK_BYTES, check_text_file, iter_text_chunks
from speedtronic_data.tokenizer import CharTokenizer, check_ids, encode_text, is_byte_tokenizer

DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's shard size: 200 MB of uint16


@dataclass
class PrepareResult:
    """What prepare_shards wrote."""

    train_paths: list[Path] = field(default_factory=list)
    val_paths: list[Path] = field(default_factory=list)
    train_tokens: int = 0
    val_tokens: int = 0


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
        path = write_shard(
            self.out_dir / f"{self.split}_{len(self.paths):06d}.bin", np.concatenate(self.parts)
        )
        self.paths.append(path)
        self.total += self.buffered
        rate = self.total / max(time.perf_counter() - self.started, 1e-9)
        self.report(
            f"wrote {path} ({self.buffered:,} tokens; {self.split} total {self.total:,}, "
            f"{rate:,.0f} tokens/s)"
        )
        self.parts, self.buffered = [], 0


def _encode_chunk(tokenizer: Any, text: str, vocab_size: int | None, source: str) -> np.ndarray:
    if is_byte_tokenizer(tokenizer):
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    else:
        ids = np.asarray(encode_text(tokenizer, text), dtype=np.int64)
    if ids.size:
        check_ids(ids, vocab_size if vocab_size is not None else 2**32, source)
    return ids


def _split_at_line(text: str, head_bytes: float) -> tuple[str, str]:
    """Split text after the first line break at or past head_bytes (so no line is in both splits),
    else at it.
    """
    if head_bytes <= 0:
        return "", text
    raw = text.encode("utf-8")
    if head_bytes >= len(raw):
        return text, ""
    cut = raw.find(b"\n", int(head_bytes)) + 1
    if cut == 0:  # no line break left: cut at the byte count, on a character boundary
        cut = int(head_bytes)
        while cut > 0 and raw[cut] & 0xC0 == 0x80:
            cut -= 1
    return raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8")


def _chunks(text: str) -> Iterator[str]:
    for start in range(0, len(text), CHUNK_BYTES):
        yield text[start : start + CHUNK_BYTES]


def prepare_shards(
    text_paths: Iterable[str | Path],
    out_dir: str | Path,
    tokenizer: Any | None = None,
    val_fraction: float = 0.05,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    *,
    texts: Iterable[str] = (),
    progress: Callable[[str], None] | None = print,
) -> PrepareResult:
    """Tokenize text files (and in-memory texts) into train_*.bin / val_*.bin llm.c shards under
    out_dir.

    The first val_fraction of each source's text goes to validation, the rest to training. Every
    shard is written atomically; shards left from an earlier, longer run are removed.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise DataError(f"shard_tokens must be positive, got {shard_tokens}")
    tokenizer = tokenizer if tokenizer is not None else CharTokenizer()
    vocab = getattr(tokenizer, "vocab_size", None)
    vocab = (
        tokenizer.get_vocab_size()
        if callable(getattr(tokenizer, "get_vocab_size", None))
        else vocab
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = progress or (lambda line: None)
    writers = {split: _ShardWriter(out, split, shard_tokens, report) for split in ("train", "val")}

    sources: list[tuple[str, int, Iterator[str]]] = []
    for item in text_paths:
        path = check_text_file(Path(item))
        sources.append((str(path), path.stat().st_size, iter_text_chunks(path)))
    for number, text in enumerate(texts):
        sources.append((f"texts[{number}]", len(text.encode("utf-8")), _chunks(text)))
    if not sources:
        raise DataError("prepare_shards got no text: pass text files or texts=[...]")
    for name, size, chunks in sources:
        val_bytes, seen = val_fraction * size, 0
        for chunk in chunks:
            head, tail = _split_at_line(chunk, val_bytes - seen)
            seen += len(chunk.encode("utf-8"))
            for split, text in (("val", head), ("train", tail)):
                if text:
                    writers[split].add(_encode_chunk(tokenizer, text, vocab, name))
    for writer in writers.values():
        writer.flush()
        for stale in sorted(out.glob(f"{writer.split}_*.bin")):
            if stale not in writer.paths:
                stale.unlink()
    result = PrepareResult(
        writers["train"].paths, writers["val"].paths, writers["train"].total, writers["val"].total
    )
    if not result.train_tokens:
        raise DataError(
            f"prepare_shards produced no training tokens from {[s[0] for s in sources]}; "
            "lower val_fraction or add text"
        )
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
