"""A tokenizer's recorded identity (kind, vocab_size, name, sha256), and when two identities
encode text alike.

Token shard folders (speedtronic-data) and checkpoints (speedtronic-trainer) both record the
tokenizer their ids came from, and neither package may import the other: the rule that decides
whether two records mean the same ids is written here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _ids_key(identity: Mapping[str, Any]) -> tuple[Any, ...]:
    """Return what decides a tokenizer's ids: every byte tokenizer maps text alike (its vocab_size
    only caps the bytes a folder may hold); a tokenizers file by its size and sha256; a custom
    (Python) tokenizer by its size and class name.
    """
    kind = identity.get("kind")
    if kind == "bytes":
        return (kind,)
    name = identity.get("name") if kind == "custom" else None
    return kind, identity.get("vocab_size"), identity.get("sha256"), name


def encode_alike(first: Mapping[str, Any], second: Mapping[str, Any]) -> bool:
    """Return True when two recorded identities name tokenizers that map text to the same ids."""
    return _ids_key(first) == _ids_key(second)


def describe_tokenizer(identity: Mapping[str, Any]) -> str:
    """Return a short description of a recorded identity, e.g. `tokenizer.json (50,257 ids)`."""
    size = identity.get("vocab_size")
    ids = f"{size:,} ids" if isinstance(size, int) else "vocabulary unknown"
    label = "the byte tokenizer" if identity.get("kind") == "bytes" else identity.get("name")
    return f"{label} ({ids})"


def describe_apart(first: Mapping[str, Any], second: Mapping[str, Any]) -> tuple[str, str]:
    """Return describe_tokenizer of two identities that do not encode alike, told apart: two
    tokenizer.json files of one size would read the same, so each then names its sha256's start.
    """
    one, other = describe_tokenizer(first), describe_tokenizer(second)
    if one != other:
        return one, other
    # "tokenizer.json (288 ids)" -> "tokenizer.json (288 ids, sha256 0123456789ab)"
    return (
        f"{one[:-1]}, sha256 {str(first.get('sha256'))[:12]})",
        f"{other[:-1]}, sha256 {str(second.get('sha256'))[:12]})",
    )


__all__ = ["describe_apart", "describe_tokenizer", "encode_alike"]
