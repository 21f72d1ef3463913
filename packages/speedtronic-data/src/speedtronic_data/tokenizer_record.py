"""Which tokenizer wrote a folder of token shards: a small JSON record beside them.

`prepare_shards` writes `tokenizer_record.json` (kind, vocabulary size, a name) and, for a
`tokenizers` tokenizer, a byte-exact copy of its `tokenizer.json`. Training reads the record to
refuse a model whose vocabulary cannot hold the tokenizer's ids; export reads it to ship the
tokenizer the run used. A folder without a record (written before 2.1) holds byte-level tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic_config.atomic import atomic_write_text
from speedtronic_config.tokenizer_identity import describe_tokenizer, encode_alike
from speedtronic_data.errors import DataError
from speedtronic_data.tokenizer import CharTokenizer, JsonTokenizer, as_json_tokenizer

RECORD_NAME = "tokenizer_record.json"
TOKENIZER_JSON = "tokenizer.json"
BYTE_IDS = 256  # the byte tokenizer emits ids 0-255 whatever its vocab_size
# Left by prepare while it replaces a folder's shards and removed once their record is written:
# shards beside it are an interrupted (or refused) run's part, not a corpus to train on.
UNFINISHED_NAME = ".prepare_unfinished"


@dataclass(frozen=True)
class TokenizerRecord:
    """A tokenizer as recorded beside shards: kind is bytes, tokenizers or custom."""

    kind: str
    vocab_size: int | None  # ids it can emit; None when unknown (custom, or a pre-2.1 folder)
    name: str
    sha256: str | None = None  # of tokenizer.json, for kind tokenizers
    folder: Path | None = None  # where the record (and the tokenizer.json copy) lives

    @property
    def tokenizer_json(self) -> Path | None:
        """Return the recorded tokenizer.json copy, for kind tokenizers."""
        if self.kind != "tokenizers" or self.folder is None:
            return None
        return self.folder / TOKENIZER_JSON

    def same_tokenizer(self, other: TokenizerRecord) -> bool:
        """Return True when both records name the same tokenizer (wherever they are stored)."""
        return (self.kind, self.vocab_size, self.sha256) == (
            other.kind,
            other.vocab_size,
            other.sha256,
        ) and (self.kind != "custom" or self.name == other.name)

    def encodes_alike(self, other: TokenizerRecord) -> bool:
        """Return True when both map text to the same ids: the same tokenizer, both the byte
        tokenizer (whose vocab_size only caps which bytes a folder may hold), or two tokenizers at
        hand (see behaves_alike) that do, such as one tokenizer.json saved twice.
        """
        if encode_alike(self.identity(), other.identity()):
            return True
        return self.at_hand and other.at_hand and behaves_alike(self, other)

    @property
    def at_hand(self) -> bool:
        """Return True when the tokenizer itself can be loaded: bytes, or a recorded file."""
        return self.kind == "bytes" or self.tokenizer_json is not None

    def identity(self) -> dict[str, Any]:
        """Return what a checkpoint records of this tokenizer: kind, vocab_size, name, sha256."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "name": self.name,
            "sha256": self.sha256,
        }

    def describe(self) -> str:
        """Return a short human description, e.g. `tokenizer.json (50,257 ids)`."""
        return describe_tokenizer(self.identity())


BYTES = TokenizerRecord("bytes", BYTE_IDS, "bytes")
# Text that tells tokenizers apart where their vocabularies agree: whitespace runs, digits, code,
# accents, CJK, an emoji (byte fallback) and a special-looking token.
PROBE_TEXT = (
    "The quick brown fox, 1234567 times!  \n\tdef f(x):\n        return x ** 2  # ok\n"
    "Cafe\u0301 na\u00efve \u00fcber \u65e5\u672c\u8a9e \u0645\u0631\u062d\u0628\u0627 "
    "\U0001f680 <|endoftext|> <s></s>"
)


def _merges(tokenizer: Any) -> list[tuple[str, ...]] | None:
    """Return a BPE tokenizer's merges as pairs (tokenizers writes "a b" strings or [a, b] lists,
    by version); None for other models.
    """
    merges = json.loads(tokenizer.text).get("model", {}).get("merges")
    if merges is None:
        return None
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def behaves_alike(first: TokenizerRecord | Any, second: TokenizerRecord | Any) -> bool:
    """Return True when two tokenizers map text to the same ids: one vocabulary (added tokens
    included) and merges, and the same ids for PROBE_TEXT; a byte tokenizer compares by the probe
    alone (a tokenizer.json that maps each byte to itself, as export writes, matches it). Each is
    a loadable record or a tokenizer object already loaded.
    """
    a, b = (
        load_tokenizer(t) if isinstance(t, TokenizerRecord) else as_json_tokenizer(t)
        for t in (first, second)
    )
    if isinstance(a, JsonTokenizer) and isinstance(b, JsonTokenizer):
        vocab = a.tokenizer.get_vocab(with_added_tokens=True)
        if vocab != b.tokenizer.get_vocab(with_added_tokens=True) or _merges(a) != _merges(b):
            return False
    return a.encode(PROBE_TEXT) == b.encode(PROBE_TEXT)


def record_from_identity(identity: Any) -> TokenizerRecord:
    """Return the record a checkpoint's identity (TokenizerRecord.identity()) stands for."""
    try:
        return TokenizerRecord(
            str(identity["kind"]), identity["vocab_size"], str(identity["name"]), identity["sha256"]
        )
    except (KeyError, TypeError) as error:
        raise DataError(
            f"the checkpoint's tokenizer entry {identity!r} is malformed ({type(error).__name__}: "
            f"{error}); pass a checkpoint a Speedtronic run wrote"
        ) from None


def record_for(tokenizer: Any) -> TokenizerRecord:
    """Return the record that describes a tokenizer object (before anything is written)."""
    tokenizer = as_json_tokenizer(tokenizer)
    if tokenizer is None or type(tokenizer) is CharTokenizer:
        size = BYTE_IDS if tokenizer is None else min(tokenizer.vocab_size, BYTE_IDS)
        return TokenizerRecord("bytes", size, "bytes")
    if isinstance(tokenizer, JsonTokenizer):
        digest = hashlib.sha256(tokenizer.text.encode("utf-8")).hexdigest()
        return TokenizerRecord(
            "tokenizers", tokenizer.vocab_size, Path(tokenizer.name).name, digest
        )
    size = getattr(tokenizer, "vocab_size", None)
    if callable(getattr(tokenizer, "get_vocab_size", None)):
        size = tokenizer.get_vocab_size()
    kind = type(tokenizer)
    return TokenizerRecord(
        "custom", size if isinstance(size, int) else None, f"{kind.__module__}.{kind.__qualname__}"
    )


def check_tokenizer_copy(out_dir: str | Path, tokenizer: Any) -> None:
    """Raise DataError when out_dir holds a tokenizer.json that no record there names (the
    user's own, not a copy prepare wrote) and recording `tokenizer` would replace or delete it.
    """
    out = Path(out_dir)
    copy = out / TOKENIZER_JSON
    if not copy.is_file():
        return
    tokenizer = as_json_tokenizer(tokenizer)
    if isinstance(tokenizer, JsonTokenizer) and _same_json(copy, tokenizer.text):
        return  # that tokenizer: written again, only its line endings or layout may change
    try:
        ours = read_record(out).tokenizer_json == copy  # the record names it: prepare wrote it
    except DataError:  # an unreadable record names nothing
        ours = False
    if not ours:
        action = "replace" if isinstance(tokenizer, JsonTokenizer) else "delete"
        raise DataError(
            f"{copy} was not written by speedtronic prepare, and preparing into {out} would "
            f"{action} it; to tokenize with it pass --tokenizer {copy} (in Python "
            "tokenizer=JsonTokenizer.from_file(path)), else prepare into another folder"
        )


def _same_json(path: Path, text: str) -> bool:
    """Return whether the JSON file at path holds the same data as text (CRLF, indentation and
    key order aside)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")) == json.loads(text)
    except (OSError, ValueError):
        return False


def mark_unfinished(out_dir: str | Path) -> None:
    """Mark out_dir's shards as being replaced, then drop its record (it would vouch for tokens
    another tokenizer wrote); write_record clears the mark.
    """
    out = Path(out_dir)
    (out / UNFINISHED_NAME).touch()
    (out / RECORD_NAME).unlink(missing_ok=True)


def is_unfinished(folder: str | Path) -> bool:
    """Return whether folder's shards are an interrupted or refused prepare's part."""
    return (Path(folder) / UNFINISHED_NAME).is_file()


def write_record(out_dir: str | Path, tokenizer: Any) -> TokenizerRecord:
    """Write the record of tokenizer (and a copy of its tokenizer.json) into out_dir; return it."""
    out = Path(out_dir)
    tokenizer = as_json_tokenizer(tokenizer)
    record = record_for(tokenizer)
    copy = out / TOKENIZER_JSON
    if isinstance(tokenizer, JsonTokenizer):
        atomic_write_text(copy, tokenizer.text)
    else:
        copy.unlink(missing_ok=True)  # left by an earlier prepare with another tokenizer
    fields = {"kind": record.kind, "vocab_size": record.vocab_size, "name": record.name}
    if record.sha256 is not None:
        fields.update(file=TOKENIZER_JSON, sha256=record.sha256)
    atomic_write_text(out / RECORD_NAME, json.dumps({"format": 1, **fields}, indent=2) + "\n")
    (out / UNFINISHED_NAME).unlink(missing_ok=True)
    return dataclasses.replace(record, folder=out)


def read_record(folder: str | Path) -> TokenizerRecord:
    """Return the record in folder; the byte tokenizer (vocabulary unchecked) when it has none."""
    folder = Path(folder)
    if is_unfinished(folder):
        raise DataError(
            f"{folder} holds the shards of an unfinished `speedtronic prepare` (interrupted, or "
            "an input refused); run it again to finish them, or delete the folder"
        )
    path = folder / RECORD_NAME
    if not path.is_file():
        # Shards written before 2.1 carry no record: byte-level, but their vocabulary may have
        # been cut below 256, so it is not checked.
        return TokenizerRecord("bytes", None, "bytes", folder=folder)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = TokenizerRecord(
            data["kind"], data["vocab_size"], data["name"], data.get("sha256"), folder
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(
            f"{path} is unreadable ({error}); run `speedtronic prepare` again into a fresh folder"
        ) from None
    if record.kind == "tokenizers" and not (folder / TOKENIZER_JSON).is_file():
        raise DataError(f"{path} names {TOKENIZER_JSON}, which is missing from {folder}")
    return record


def shards_record(shard_paths: Iterable[str | Path]) -> TokenizerRecord:
    """Return the one tokenizer record of the folders holding shard_paths (byte-level folders of
    other vocabulary cuts, or without a record, mix: the vocabulary is then their largest, or
    unknown).
    """
    folders = sorted({Path(p).parent for p in shard_paths})
    if not folders:
        raise DataError("shards_record needs at least one shard path")
    records = [read_record(folder) for folder in folders]
    first = records[0]
    for folder, record in zip(folders[1:], records[1:], strict=True):
        if not record.encodes_alike(first):
            raise DataError(
                f"these token shards come from different tokenizers: {folders[0]} holds "
                f"{first.describe()}, {folder} holds {record.describe()}; prepare them with one"
            )
    sizes = {record.vocab_size for record in records}
    if len(sizes) > 1:  # only byte-level records differ here; every shard's ids are still checked
        return dataclasses.replace(first, vocab_size=None if None in sizes else max(sizes))
    return first


def check_vocab(
    record: TokenizerRecord,
    vocab_size: int | None,
    subject: str,
    fix: str = "prepare the shards with",
) -> None:
    """Raise DataError when the model's vocabulary cannot hold every id the tokenizer emits;
    `subject` names the data and ends in a verb ("token shards in data/web were written by").
    """
    if vocab_size is None or record.vocab_size is None or record.vocab_size <= vocab_size:
        return
    raise DataError(
        f"{subject} {record.describe()} but data.vocab_size (model.vocab_size unless set) is "
        f"{vocab_size:,}; set model.vocab_size (and data.vocab_size, if set) to at least "
        f"{record.vocab_size} or {fix} a tokenizer of at most {vocab_size:,} ids"
    )


def load_tokenizer(record: TokenizerRecord) -> Any:
    """Return a tokenizer object for a record: CharTokenizer or JsonTokenizer."""
    if record.kind == "bytes":
        return CharTokenizer()
    if record.tokenizer_json is not None:
        return JsonTokenizer.from_file(record.tokenizer_json)
    raise DataError(
        f"the shards were written by {record.describe()}, a Python tokenizer with no "
        "tokenizer.json; pass that tokenizer yourself"
    )


__all__ = [
    "BYTES",
    "RECORD_NAME",
    "TOKENIZER_JSON",
    "UNFINISHED_NAME",
    "TokenizerRecord",
    "behaves_alike",
    "check_tokenizer_copy",
    "check_vocab",
    "is_unfinished",
    "load_tokenizer",
    "mark_unfinished",
    "read_record",
    "record_for",
    "record_from_identity",
    "shards_record",
    "write_record",
]
