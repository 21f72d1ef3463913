"""The byte-level tokenizer and the adapter that makes any supported tokenizer return a list
of ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from speedtronic_data.errors import DataError


class CharTokenizer:
    """A deterministic byte-level tokenizer: UTF-8 bytes are the ids (0-255)."""

    def __init__(self, vocab_size: int = 256) -> None:
        if vocab_size < 1:
            raise DataError(f"CharTokenizer vocab_size must be positive, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of text as ids; raises DataError when a byte does not fit
        vocab_size.
        """
        ids = list(text.encode("utf-8"))
        if ids and self.vocab_size < 256:
            check_ids(ids, self.vocab_size, "CharTokenizer")
        return ids

    def decode(self, ids: Any) -> str:
        """Return the text whose UTF-8 bytes are ids (invalid sequences become U+FFFD)."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)


def is_byte_tokenizer(tokenizer: Any) -> bool:
    """True when tokenizer is exactly the byte-level CharTokenizer, whose ids can be read straight
    from bytes.
    """
    return type(tokenizer) is CharTokenizer


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Return token ids for text from a callable, an object with encode, or a Hugging Face
    Tokenizer.
    """
    encode = getattr(tokenizer, "encode", None)
    out = encode(text) if callable(encode) else tokenizer(text) if callable(tokenizer) else None
    if out is None:
        raise DataError(
            f"tokenizer {type(tokenizer).__name__} is neither callable nor has encode(); "
            "pass a callable, an object with encode(text) -> ids, or a tokenizers.Tokenizer"
        )
    ids = getattr(out, "ids", out)  # a tokenizers.Encoding carries its ids in .ids
    if isinstance(ids, dict) and "input_ids" in ids:  # transformers tokenizers called directly
        ids = ids["input_ids"]
    return list(ids)


def check_ids(ids: Any, vocab_size: int, source: str) -> None:
    """Raise DataError naming source when an id is negative or not below vocab_size."""
    values = np.asarray(
        ids
    )  # numpy reductions: builtin max/min walk an array one boxed element at a time
    largest, smallest = int(values.max()), int(values.min())
    if largest >= vocab_size:
        raise DataError(
            f"{source}: token id {largest} is >= vocab_size {vocab_size}; raise data.vocab_size "
            f"(or model.vocab_size) to at least {largest + 1} or use a smaller tokenizer"
        )
    if smallest < 0:
        raise DataError(
            f"{source}: negative token id {smallest}; the tokenizer must return ids >= 0"
        )


__all__ = ["CharTokenizer", "check_ids", "encode_text", "is_byte_tokenizer"]
