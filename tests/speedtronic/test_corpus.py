"""speedtronic prepare's library half: inputs of every kind, the tokenizer, progress, tokens/s."""

from __future__ import annotations

import json

import pytest

from speedtronic.corpus import prepare_corpus
from speedtronic.errors import UsageError
from speedtronic_data import read_shard_tokens


def test_mixed_inputs_with_a_tokenizer_json(tmp_path, bpe_json, capsys):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("def add(a, b):\n    return a + b\n" * 30)
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "class Point:\n    x: int = 0"}) + "\n")
    pq.write_table(pa.table({"body": ["y: int = 0", "return a"] * 10}), tmp_path / "c.parquet")
    inputs = [tmp_path / "a.txt", tmp_path / "b.jsonl", tmp_path / "c.parquet"]
    result = prepare_corpus(
        tmp_path / "out", inputs, 0, 0.1, tokenizer=bpe_json, text_column="body", progress=True
    )
    out, err = capsys.readouterr()
    assert f"{result.train_tokens:,} train + {result.val_tokens:,} val tokens" in out
    assert "tokens/s" in out.splitlines()[-1] and "tokenizer.json" in out.splitlines()[-1]
    assert "prepare:" in err and "tok_s=" in err  # the bar, forced on although not a terminal
    assert result.tokenizer.kind == "tokenizers"
    assert max(int(read_shard_tokens(p).max()) for p in result.train_paths) >= 256


def test_rerun_is_a_no_op_unless_the_tokenizer_changed(tmp_path, bpe_json, capsys):
    (tmp_path / "a.txt").write_text("line\n" * 100)
    assert prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.1) is not None
    assert prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.1) is None
    assert "already in" in capsys.readouterr().out
    with pytest.raises(UsageError, match="already holds shards written by the byte tokenizer"):
        prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.1, tokenizer=bpe_json)


def test_missing_inputs_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="nope.parquet: no such file or folder"):
        prepare_corpus(tmp_path / "out", [tmp_path / "nope.parquet"], 0, 0.1)
    with pytest.raises(UsageError, match="--tokenizer .*gone.json: no such file"):
        prepare_corpus(tmp_path / "out", [], 1000, 0.1, tokenizer=tmp_path / "gone.json")


def test_a_tokenizer_is_named_by_its_file_or_the_folder_holding_it(tmp_path, bpe_json):
    from speedtronic.corpus import tokenizer_file

    assert tokenizer_file(bpe_json) == bpe_json
    assert tokenizer_file(bpe_json.parent) == bpe_json  # an HF export or a Hub snapshot
    with pytest.raises(UsageError, match=r"--tokenizer .*empty: a folder without a tokenizer.json"):
        (tmp_path / "empty").mkdir()
        tokenizer_file(tmp_path / "empty")
    with pytest.raises(
        UsageError, match="gone.json: no such file; pass a tokenizer.json or its folder"
    ):
        tokenizer_file(tmp_path / "gone.json")
