"""Corpus preparation for `speedtronic prepare`: text files (or the Python stdlib) to token
shards.
"""

from __future__ import annotations

from pathlib import Path

from speedtronic.errors import UsageError


def prepare_corpus(
    out_dir: Path, texts: list[Path], stdlib_bytes: int, val_fraction: float
) -> None:
    """Tokenize texts (default: the Python stdlib's source) byte-level into train/val shards,
    once.
    """
    from speedtronic_data import prepare_shards, stdlib_corpus

    if sorted(out_dir.glob("train_*.bin")) and sorted(out_dir.glob("val_*.bin")):
        print(f"prepare: shards already in {out_dir}; delete the folder to rebuild them")
        return
    for text in texts:
        if not text.is_file():
            raise UsageError(f"{text}: no such text file")
    inline = [] if texts else [stdlib_corpus(stdlib_bytes)]
    prepare_shards(texts, out_dir, val_fraction=val_fraction, texts=inline)
