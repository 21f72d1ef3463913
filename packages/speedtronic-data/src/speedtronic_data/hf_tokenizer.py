"""A run's tokenizer as the files `transformers.AutoTokenizer.from_pretrained` reads.

The byte tokenizer becomes a `tokenizers` byte-level BPE with no merges: GPT-2's byte-to-unicode
table names the 256 byte tokens and each token's id is its byte, so ids equal CharTokenizer's for
any text, and the ByteLevel decoder turns ids back into bytes, then UTF-8 with U+FFFD for invalid
sequences, as CharTokenizer.decode does; its JSON is written directly, so exporting it needs no
`tokenizers` install. A `tokenizers` tokenizer.json is copied through byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speedtronic_config.atomic import atomic_write_text
from speedtronic_data.errors import DataError
from speedtronic_data.tokenizer import CharTokenizer, JsonTokenizer, as_json_tokenizer
from speedtronic_data.tokenizer_record import BYTE_IDS, TOKENIZER_JSON

# Special-token spellings of common tokenizers, most specific first; a tokenizer.json has no field
# saying which of its added tokens begins or ends a sequence.
EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>")
# Files transformers reads beside tokenizer.json that add tokens, set bos/eos/pad or give it chat
# templates: another tokenizer's, left in the folder, would change the ids of the one written here
# or format chats in another model's special tokens (a run's tokenizer.json has no template).
TOKENIZER_EXTRAS = (
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "additional_chat_templates/*.jinja",
)
TOKENIZER_CONFIG = "tokenizer_config.json"
# The files write_hf_tokenizer writes.
HF_TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG)


def bytes_to_unicode() -> dict[int, str]:
    """Return GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table = {byte: chr(byte) for byte in printable}
    # The remaining bytes (controls, space, ...) map to code points from 256 up, in byte order.
    for offset, byte in enumerate(b for b in range(BYTE_IDS) if b not in table):
        table[byte] = chr(BYTE_IDS + offset)
    return dict(sorted(table.items()))


def byte_level_tokenizer_json() -> dict[str, Any]:
    """Return the tokenizer.json content of the byte tokenizer: id = UTF-8 byte, no merges."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        # use_regex off: with no merges the GPT-2 word split cannot change any token
        "pre_tokenizer": {**byte_level, "use_regex": False},
        "post_processor": None,
        "decoder": {**byte_level, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {char: byte for byte, char in bytes_to_unicode().items()},
            "merges": [],
        },
    }


def special_tokens(tokenizer_json: dict[str, Any]) -> tuple[tuple[str, int] | None, ...]:
    """Return ((bos token, id) or None, (eos token, id) or None) from a tokenizer.json's special
    added tokens, by their usual spellings.
    """
    added = {
        token["content"]: token["id"]
        for token in tokenizer_json.get("added_tokens") or []
        if token.get("special")
    }

    def pick(names: tuple[str, ...]) -> tuple[str, int] | None:
        return next(((name, added[name]) for name in names if name in added), None)

    return pick(BOS_NAMES), pick(EOS_NAMES)


def _json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def write_hf_tokenizer(
    out_dir: str | Path, tokenizer: Any, *, model_max_length: int
) -> tuple[int | None, int | None]:
    """Write tokenizer.json and tokenizer_config.json of a CharTokenizer or JsonTokenizer into
    out_dir; return the (bos_token_id, eos_token_id) they define (None for the byte tokenizer).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = as_json_tokenizer(tokenizer)
    if type(tokenizer) is CharTokenizer:
        text = _json_text(byte_level_tokenizer_json())
    elif isinstance(tokenizer, JsonTokenizer):
        text = tokenizer.text  # copied through unchanged
    else:
        raise DataError(
            f"{type(tokenizer).__name__} has no tokenizer.json to export; pass the byte "
            "tokenizer (CharTokenizer) or a tokenizer.json (JsonTokenizer)"
        )
    bos, eos = special_tokens(json.loads(text))
    atomic_write_text(out / TOKENIZER_JSON, text)
    config = {
        # transformers 4.x and 5.x both map this onto their tokenizers-backed class
        "tokenizer_class": "PreTrainedTokenizerFast",
        # the default clean-up rewrites " ." as "." and would change decoded text
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "bos_token": bos[0] if bos else None,
        "eos_token": eos[0] if eos else None,
    }
    atomic_write_text(out / TOKENIZER_CONFIG, _json_text(config))
    return (bos[1] if bos else None, eos[1] if eos else None)


__all__ = [
    "BOS_NAMES",
    "EOS_NAMES",
    "HF_TOKENIZER_FILES",
    "TOKENIZER_CONFIG",
    "TOKENIZER_EXTRAS",
    "byte_level_tokenizer_json",
    "bytes_to_unicode",
    "special_tokens",
    "write_hf_tokenizer",
]
