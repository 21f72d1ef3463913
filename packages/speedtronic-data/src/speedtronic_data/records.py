"""Documents from record files: Parquet, JSON Lines, or a Hugging Face `datasets` folder.

A record source is a table with one text column. Parquet files and `datasets.save_to_disk`
folders (Arrow stream files listed in state.json) are read with pyarrow, an optional extra;
JSON Lines needs nothing. Documents stream in row order with bounded memory (one record batch).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic_data.errors import DataError, not_a_file, unreadable

# `.json` too: what `datasets`' to_json() writes under that name is JSON Lines.
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)


def is_record_source(path: Path) -> bool:
    """Return True when path is read as records (a folder, Parquet or JSON Lines), not as text."""
    return path.is_dir() or path.suffix.lower() in JSONL_SUFFIXES + PARQUET_SUFFIXES


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (the submodule is not imported by pyarrow itself)
    except ImportError:
        raise DataError(
            "reading Parquet files and `datasets` folders needs pyarrow: "
            "pip install 'speedtronic-data[arrow]'"
        ) from None
    return pyarrow


@dataclass(frozen=True)
class RecordSource:
    """One record file or `datasets` folder: its rows, a size estimate and how to read the text."""

    path: Path
    kind: str  # parquet, jsonl or arrow
    column: str
    num_rows: int
    approx_bytes: int  # for progress: a JSON Lines file's size, the text column's otherwise
    files: tuple[Path, ...]

    def texts(self) -> Iterator[str]:
        """Yield the text column row by row, skipping nulls."""
        return (text for text, _ in self.rows() if text is not None)

    def rows(self) -> Iterator[tuple[str | None, int]]:
        """Yield (text, size) row by row: the text column (None for a null, or a blank JSON Lines
        line) and the row's share of approx_bytes, so the sizes add up to it as the rows are read.
        """
        if self.kind == "jsonl":
            yield from _jsonl_rows(self.path, self.column)
            return
        for batch in self._batches():
            for value in batch.column(self.column).to_pylist():
                if value is not None and not isinstance(value, str):
                    raise DataError(
                        f"{self.path}: column {self.column!r} holds {type(value).__name__} "
                        "values, not text; pass the text column with --text-column"
                    )
                yield value, 0 if value is None else len(value.encode("utf-8"))

    def _batches(self) -> Iterator[Any]:
        pa = _pyarrow()
        for path in self.files:
            if self.kind == "parquet":
                yield from pa.parquet.ParquetFile(path).iter_batches(columns=[self.column])
            else:
                with pa.memory_map(str(path)) as source:
                    yield from pa.ipc.open_stream(source)


def _check_column(path: Path, column: str, names: list[str]) -> None:
    if column not in names:
        raise DataError(
            f"{path} has no column {column!r} (columns: {', '.join(names) or 'none'}); "
            "name the text column with --text-column"
        )


def _jsonl_rows(path: Path, column: str) -> Iterator[tuple[str | None, int]]:
    """Yield each line's text field (None: null, or a blank line) and the line's bytes."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}:{number}: not valid UTF-8 (byte {error.start} of the line); "
                    "re-encode the file as UTF-8"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark (Windows tools) is no JSON
            if not line.strip():
                yield None, len(raw)
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise DataError(
                    f"{path}:{number}: not a JSON object ({error}); a {path.suffix} file is read "
                    "as JSON Lines, one object per line"
                ) from None
            if not isinstance(row, dict):  # a JSON array of objects: --text-column cannot help
                raise DataError(
                    f"{path}:{number}: a JSON {type(row).__name__}, not an object; a "
                    f"{path.suffix} file is read as JSON Lines: write one object per line"
                )
            if column not in row:
                raise DataError(
                    f"{path}:{number}: no {column!r} field (has {', '.join(row)}); "
                    "name the text field with --text-column"
                )
            value = row[column]
            if value is not None and not isinstance(value, str):
                raise DataError(
                    f"{path}:{number}: {column!r} is {type(value).__name__}, not text; "
                    "name the text field with --text-column"
                )
            yield value, len(raw)


def _jsonl(path: Path, column: str) -> RecordSource:
    with open(path, "rb") as handle:
        rows = sum(1 for line in handle if line.strip())
    return RecordSource(path, "jsonl", column, rows, path.stat().st_size, (path,))


def _parquet(path: Path, column: str) -> RecordSource:
    pa = _pyarrow()
    try:
        meta = pa.parquet.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as error:
        raise DataError(
            f"{path} is not a readable Parquet file ({str(error).rstrip('.')}); write it again, "
            "or pass its text as a .txt or .jsonl file"
        ) from None
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    _check_column(path, column, names)
    index = names.index(column)
    size = sum(
        meta.row_group(g).column(index).total_uncompressed_size for g in range(meta.num_row_groups)
    )
    return RecordSource(path, "parquet", column, meta.num_rows, size, (path,))


def _datasets_folder(path: Path, column: str) -> RecordSource:
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise DataError(
            f"{path} is a DatasetDict with splits {', '.join(splits)}; pass one split's folder, "
            f"e.g. {path / (splits[0] if splits else 'train')}"
        )
    state = path / "state.json"
    if not state.is_file():
        raise DataError(
            f"{path} is a folder but not a `datasets` save_to_disk folder (no state.json); pass "
            "text, Parquet (.parquet) or JSON Lines (.jsonl) files, or such a folder"
        )
    try:
        files = tuple(
            path / item["filename"] for item in json.loads(state.read_text())["_data_files"]
        )
    except (ValueError, KeyError, TypeError) as error:
        raise DataError(f"{state} is unreadable: {error}") from None
    pa = _pyarrow()
    rows, size = 0, 0
    for file in files:
        if not file.is_file():
            raise DataError(f"{state} names {file.name}, which is missing")
        with pa.memory_map(str(file)) as source:
            table = pa.ipc.open_stream(source).read_all()  # memory-mapped: no copy of the data
            _check_column(path, column, table.column_names)
            rows += table.num_rows
            size += table.column(column).nbytes
    return RecordSource(path, "arrow", column, rows, size, files)


def open_records(path: str | Path, column: str = "text") -> RecordSource:
    """Return the record source at path (Parquet, JSON Lines or a `datasets` folder)."""
    path = Path(path)
    try:
        return _open_records(path, column)
    except OSError as error:  # no read permission, say: the file that could not be read
        raise unreadable(repr(str(error.filename or path)), error) from None


def _open_records(path: Path, column: str) -> RecordSource:
    if path.is_dir():
        return _datasets_folder(path, column)
    if (problem := not_a_file(path)) is not None:
        raise DataError(f"{path} {problem}")
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return _parquet(path, column)
    if path.suffix.lower() in JSONL_SUFFIXES:
        return _jsonl(path, column)
    raise DataError(
        f"{path} is not a record file; use .parquet, .jsonl (.json) or a `datasets` folder"
    )


__all__ = ["RecordSource", "is_record_source", "open_records"]
