"""The byte-level tokenizer and the adapter that makes any supported tokenizer return a list
of ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from speedtronic_data.errors import DataError, check_positive_int

# How to fix a file given as a tokenizer.json that is not one.
_FIX = "pass the file Tokenizer.save() wrote, or the folder holding it"


class CharTokenizer:
    """A deterministic byte-level tokenizer: UTF-8 bytes are the ids (0-255)."""

    def __init__(self, vocab_size: int = 256) -> None:
        check_positive_int("CharTokenizer", "vocab_size", vocab_size)
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
        """Return the text whose UTF-8 bytes are ids (invalid sequences become U+FFFD).

        Ids from 256 up stand for no byte (a vocabulary larger than 256 leaves them unused) and
        decode to nothing, as they do in the exported `tokenizers` tokenizer.json.
        """
        return bytes(i for i in map(int, ids) if 0 <= i < 256).decode("utf-8", errors="replace")

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)


def import_tokenizers() -> Any:
    """Return the `tokenizers` module, or raise DataError naming the extra that installs it."""
    try:
        import tokenizers
    except ImportError:
        raise DataError(
            "reading a tokenizer.json needs the Hugging Face tokenizers package: "
            "pip install 'speedtronic-data[tokenizers]'"
        ) from None
    return tokenizers


class JsonTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json: encode adds no special tokens, decode keeps all.

    Shards are one continuous token stream, so the tokenizer's post-processor (a BOS per call, for
    instance) is left out; `text` is the JSON exactly as read, so it can be copied through.
    """

    def __init__(self, text: str, name: str = "tokenizer.json") -> None:
        try:
            self.tokenizer = import_tokenizers().Tokenizer.from_str(text)
        except Exception as error:  # tokenizers raises plain Exception on malformed JSON
            raise DataError(
                f"{name} is not a tokenizers tokenizer.json ({error}); {_FIX}"
            ) from None
        self.text, self.name = text, name
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0

    @classmethod
    def from_file(cls, path: str | Path) -> JsonTokenizer:
        """Read a tokenizer.json; DataError when it is missing or not a tokenizer."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"tokenizer file {str(path)!r} does not exist; pass a tokenizer.json")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:  # a binary file: was a bare error, exit 1
            raise DataError(
                f"{path} is not a tokenizers tokenizer.json (not UTF-8 text at byte "
                f"{error.start}); {_FIX}"
            ) from None
        except OSError as error:
            raise DataError(
                f"cannot read tokenizer file {str(path)!r} ({error.strerror or error}); {_FIX}"
            ) from None
        return cls(text, str(path))

    def encode(self, text: str) -> list[int]:
        """Return the ids of text, without the special tokens a post-processor would add."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Any) -> str:
        """Return the text of ids, special tokens included (what AutoTokenizer.decode does)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)


def as_json_tokenizer(tokenizer: Any) -> Any:
    """Return a `tokenizers.Tokenizer` as a JsonTokenizer; any other tokenizer unchanged."""
    if type(tokenizer).__module__.split(".")[0] == "tokenizers" and hasattr(tokenizer, "to_str"):
        return JsonTokenizer(tokenizer.to_str(), "tokenizers.Tokenizer")
    return tokenizer


def is_byte_tokenizer(tokenizer: Any) -> bool:
    """True when tokenizer is exactly the byte-level CharTokenizer, whose ids can be read straight
    from bytes.
    """
    return type(tokenizer) is CharTokenizer


def _is_hugging_face(tokenizer: Any) -> bool:
    """True when the tokenizer's encode is a `tokenizers.Tokenizer`'s or a `transformers`
    tokenizer's own, found by class without importing either. A subclass that overrides encode
    is called as it is: its encode(text) may take no add_special_tokens.
    """
    owner = next((cls for cls in type(tokenizer).__mro__ if "encode" in vars(cls)), None)
    return owner is not None and owner.__module__.split(".")[0] in {"tokenizers", "transformers"}


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Return token ids for text from a callable, an object with encode, or a Hugging Face
    Tokenizer; a Hugging Face tokenizer adds no special tokens.
    """
    encode = getattr(tokenizer, "encode", None)
    if callable(encode) and _is_hugging_face(tokenizer):
        # Text is encoded a chunk (about a megabyte) at a time into one stream: a post-processor's
        # BOS/EOS per call would land mid-text at every chunk boundary.
        out = encode(text, add_special_tokens=False)
    elif callable(encode):
        out = encode(text)
    else:
        out = tokenizer(text) if callable(tokenizer) else None
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


__all__ = [
    "CharTokenizer",
    "JsonTokenizer",
    "as_json_tokenizer",
    "check_ids",
    "encode_text",
    "import_tokenizers",
    "is_byte_tokenizer",
]
