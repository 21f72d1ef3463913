"""Record sources: Parquet, JSON Lines and `datasets` folders written by the real libraries."""

from __future__ import annotations

import builtins
import json

import pytest

from speedtronic_data import DataError
from speedtronic_data.records import is_record_source, open_records

ROWS = ["first document", None, "second\nwith two lines\n", "third"]


def jsonl(tmp_path, rows=ROWS, key="text"):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({key: row, "n": 1}) + "\n\n" for row in rows))
    return path


def test_jsonl_rows_in_order_nulls_skipped(tmp_path):
    source = open_records(jsonl(tmp_path))
    assert (source.kind, source.num_rows) == ("jsonl", 4)
    assert list(source.texts()) == [r for r in ROWS if r is not None]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": ROWS, "n": [1, 2, 3, 4]}), path, row_group_size=2)
    source = open_records(path, "body")
    assert (source.kind, source.num_rows) == ("parquet", 4) and source.approx_bytes > 0
    assert list(source.texts()) == [r for r in ROWS if r is not None]
    with pytest.raises(DataError, match=r"no column 'text' \(columns: body, n\).*--text-column"):
        open_records(path)


def test_a_json_array_is_refused_as_no_json_lines(tmp_path):
    # It said "no 'text' field (has list); name the text field with --text-column".
    path = tmp_path / "docs.json"
    path.write_text(json.dumps([{"text": "a"}, {"text": "b"}]) + "\n")
    with pytest.raises(DataError, match=r"docs.json:1: a JSON list, not an object; .*one object"):
        list(open_records(path).texts())


def test_a_file_that_is_no_parquet_is_refused_naming_the_fix(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "docs.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"not a readable Parquet file \(.*\); write it again"):
        open_records(path)


def test_datasets_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    data = datasets.Dataset.from_dict({"text": ROWS, "n": [1, 2, 3, 4]})
    data.save_to_disk(str(tmp_path / "ds"))
    source = open_records(tmp_path / "ds")
    assert (source.kind, source.num_rows) == ("arrow", 4)
    assert list(source.texts()) == [r for r in ROWS if r is not None]
    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match="DatasetDict with splits train, test.*dd/train"):
        open_records(tmp_path / "dd")


def test_a_json_file_is_read_as_the_json_lines_datasets_writes(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "docs.json"
    datasets.Dataset.from_dict({"text": ROWS, "n": [1, 2, 3, 4]}).to_json(str(path))
    assert is_record_source(path)
    assert list(open_records(path).texts()) == [r for r in ROWS if r is not None]
    path.write_text(json.dumps([{"text": "a"}], indent=2))  # one JSON document, not lines
    with pytest.raises(DataError, match=r"docs.json:1: not a JSON object .*read as JSON Lines"):
        list(open_records(path).texts())


def test_what_counts_as_records(tmp_path):
    assert is_record_source(tmp_path) and is_record_source(tmp_path / "a.JSONL")
    assert is_record_source(tmp_path / "a.parquet") and not is_record_source(tmp_path / "a.txt")
    with pytest.raises(DataError, match="not a `datasets` save_to_disk folder"):
        open_records(tmp_path)


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"text": "a"}\nnot json\n', "docs.jsonl:2: not a JSON object"),
        ('{"body": "a"}\n', "docs.jsonl:1: no 'text' field \\(has body\\)"),
        # Named with the fix, as a Parquet column of another type is.
        ('{"text": 5}\n', "docs.jsonl:1: 'text' is int, not text; name the text field with"),
        ('{"text": ["a", "b"]}\n', "docs.jsonl:1: 'text' is list, not text; name the text"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path, content, fragment):
    path = tmp_path / "docs.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=fragment):
        list(open_records(path).texts())


def test_missing_pyarrow_names_the_extra(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(DataError, match=r"needs pyarrow: pip install 'speedtronic-data\[arrow\]'"):
        open_records(tmp_path / "x.parquet")


def test_non_utf8_and_byte_order_marked_jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"text": "a"}\n' + '{"text": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"docs.jsonl:2: not valid UTF-8 .*re-encode"):
        list(open_records(path).texts())
    path.write_bytes(b"\xef\xbb\xbf" + b'{"text": "a"}\n{"text": "b"}\n')
    assert list(open_records(path).texts()) == ["a", "b"]
