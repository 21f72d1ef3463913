"""Corpus preparation for `speedtronic prepare`: text, Parquet, JSON Lines or `datasets` folders
(or the Python stdlib) to token shards, with a progress bar and the tokens/s reached.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from speedtronic.errors import UsageError


class _Progress:
    """A tqdm bar over source bytes on an interactive stderr (tokens and tokens/s alongside)."""

    def __init__(self, enabled: bool | None) -> None:
        from tqdm import tqdm

        # disable=None: drawn only when stderr is a terminal, unless enabled says otherwise
        self.bar = tqdm(
            total=0,
            unit="B",
            unit_scale=True,
            desc="prepare",
            file=sys.stderr,
            disable=None if enabled is None else not enabled,
            dynamic_ncols=True,
        )

    def update(self, done: int, total: int, tokens: int) -> None:
        """Advance to done of total source bytes, tokens written so far."""
        if self.bar.disable:
            return
        self.bar.total = total
        self.bar.update(done - self.bar.n)
        elapsed = self.bar.format_dict["elapsed"] or 1e-9
        self.bar.set_postfix(tokens=f"{tokens:,}", tok_s=f"{tokens / elapsed:,.0f}", refresh=False)

    def write(self, line: str) -> None:
        """Print a line above the bar."""
        self.bar.write(line, file=sys.stdout)

    def warn(self, message: Any, *args: Any, **kwargs: Any) -> None:
        """Print a warning (warnings.showwarning's arguments) as one line on stderr, above the
        bar, as the CLI's errors are.
        """
        self.bar.write(f"speedtronic prepare: warning: {message}", file=sys.stderr)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()


def tokenizer_file(choice: str | Path) -> Path:
    """Return the tokenizer.json `--tokenizer` names: the file, or the one inside a folder (an
    export, a Hub snapshot); UsageError when there is none.
    """
    path = Path(choice)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return path / "tokenizer.json"
        raise UsageError(
            f"--tokenizer {choice}: a folder without a tokenizer.json; pass a tokenizer.json or "
            "the folder holding one (an export, a Hub snapshot)"
        )
    if not path.is_file():
        raise UsageError(f"--tokenizer {choice}: no such file; pass a tokenizer.json or its folder")
    return path


def prepare_corpus(
    out_dir: Path,
    inputs: list[Path],
    stdlib_bytes: int,
    val_fraction: float,
    *,
    tokenizer: Path | None = None,
    text_column: str = "text",
    progress: bool | None = None,
) -> Any:
    """Tokenize inputs (default: the Python stdlib's source) into train/val shards once, with the
    byte tokenizer or a tokenizer.json; return the PrepareResult, or None when already prepared.
    """
    from speedtronic_data import JsonTokenizer, prepare_shards, stdlib_corpus
    from speedtronic_data.errors import not_a_file
    from speedtronic_data.tokenizer_record import (
        RECORD_NAME,
        is_unfinished,
        read_record,
        record_for,
    )

    codec = JsonTokenizer.from_file(tokenizer_file(tokenizer)) if tokenizer is not None else None
    train, val = sorted(out_dir.glob("train_*.bin")), sorted(out_dir.glob("val_*.bin"))
    # An interrupted or refused run's part is rebuilt, never taken as done; shards without a
    # record that prepare did not leave (2.0's, llm.c's) are the user's: kept, never replaced.
    if (train or val) and is_unfinished(out_dir):
        print(f"prepare: {out_dir} holds an unfinished prepare's shards; rebuilding them")
    elif train or val:
        # A --val-fraction 0 run writes no val shards: its folder is whole without them.
        whole = train and (val or val_fraction == 0)
        if not whole and not (out_dir / RECORD_NAME).is_file():
            # Rebuilding would overwrite and delete them, as an earlier run's part.
            raise UsageError(
                f"{out_dir} holds {'train' if train else 'val'} shards that speedtronic prepare "
                f"did not write (no {RECORD_NAME}); prepare into another folder"
            )
        existing, wanted = read_record(out_dir), record_for(codec)
        if not existing.encodes_alike(wanted):
            raise UsageError(
                f"{out_dir} already holds shards written by {existing.describe()}, not "
                f"{wanted.describe()}; delete the folder to rebuild them"
            )
        if whole:
            print(f"prepare: shards already in {out_dir}; delete the folder to rebuild them")
            return None
        print(f"prepare: {out_dir} has no {'val' if train else 'train'} shards; rebuilding them")
    for item in inputs:
        if (problem := not_a_file(item)) is not None:
            raise UsageError(f"{item} {problem}")
        if not item.exists():
            raise UsageError(f"{item}: no such file or folder; check the path")
    inline = [] if inputs else [stdlib_corpus(stdlib_bytes)]
    bar = _Progress(progress)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = bar.warn  # a repeated input, say; restored on leaving
            result = prepare_shards(
                inputs,
                out_dir,
                codec,
                val_fraction=val_fraction,
                texts=inline,
                text_column=text_column,
                progress=bar.write,
                on_progress=bar.update,
            )
    finally:
        bar.close()
    print(
        f"prepared {result.train_tokens:,} train + {result.val_tokens:,} val tokens with "
        f"{result.tokenizer.describe()} in {result.seconds:.1f}s "
        f"({result.tokens_per_s:,.0f} tokens/s) into {out_dir}"
    )
    return result
