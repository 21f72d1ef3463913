"""speedtronic prepare's library half: inputs of every kind, the tokenizer, progress, tokens/s."""

from __future__ import annotations

import json

import pytest
import torch

from speedtronic.corpus import prepare_corpus
from speedtronic.errors import UsageError
from speedtronic_data import DataError, read_shard_tokens
from speedtronic_data.tokenizer_record import UNFINISHED_NAME, shards_record


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
    (tmp_path / "loop.txt").symlink_to("loop.txt")  # said to be missing, which it is not
    with pytest.raises(UsageError, match=r"loop.txt is a symlink loop \(its links lead back"):
        prepare_corpus(tmp_path / "out", [tmp_path / "loop.txt"], 0, 0.1)
    with pytest.raises(UsageError, match="--tokenizer .*gone.json: no such file"):
        prepare_corpus(tmp_path / "out", [], 1000, 0.1, tokenizer=tmp_path / "gone.json")


def test_a_tokenizer_is_named_by_its_file_or_the_folder_holding_it(tmp_path, bpe_json):
    from speedtronic.corpus import tokenizer_file

    assert tokenizer_file(bpe_json) == bpe_json
    assert tokenizer_file(bpe_json.parent) == bpe_json  # an HF export or a Hub snapshot
    with pytest.raises(UsageError, match=r"empty: a folder without a tokenizer.json; pass a"):
        (tmp_path / "empty").mkdir()
        tokenizer_file(tmp_path / "empty")
    with pytest.raises(
        UsageError, match="gone.json: no such file; pass a tokenizer.json or its folder"
    ):
        tokenizer_file(tmp_path / "gone.json")


def test_a_rerun_finishes_an_interrupted_prepare_instead_of_taking_it_as_done(tmp_path, capsys):
    import inspect

    from speedtronic_data import prepare_shards

    source = tmp_path / "corpus.txt"
    source.write_text(inspect.getsource(inspect), encoding="utf-8")  # real text, about 120 KB
    out = tmp_path / "out"

    def interrupt(done, total, tokens):
        if done > total // 2:
            raise KeyboardInterrupt

    # Ctrl-C half-way, after train and val shards were written but before the record.
    with pytest.raises(KeyboardInterrupt):
        prepare_shards(
            [source],
            out,
            val_fraction=0.3,
            shard_tokens=10_000,
            progress=None,
            on_progress=interrupt,
        )
    assert sorted(out.glob("train_*.bin")) and sorted(out.glob("val_*.bin"))
    # Training on the part is refused too, naming the fix.
    with pytest.raises(DataError, match="unfinished `speedtronic prepare`.*run it again"):
        shards_record(sorted(out.glob("train_*.bin")))
    result = prepare_corpus(out, [source], 0, 0.3)
    assert result is not None, "the unfinished shards were taken as already prepared"
    assert "holds an unfinished prepare's shards; rebuilding them" in capsys.readouterr().out
    assert result.train_tokens + result.val_tokens == source.stat().st_size
    assert shards_record(result.train_paths).kind == "bytes"
    assert not (out / UNFINISHED_NAME).exists()


def test_shards_prepare_did_not_write_are_kept(tmp_path, capsys):
    """Record-less shards that no prepare left unfinished (2.0's write_shard, llm.c's) are the
    user's: prepare keeps them, as before.
    """
    from speedtronic_data import write_shard

    for name in ("train_000000.bin", "val_000000.bin"):
        write_shard(tmp_path / name, torch.arange(300) % 256)
    before = (tmp_path / "train_000000.bin").read_bytes()
    assert prepare_corpus(tmp_path, [], 0, 0.1) is None
    assert "shards already in" in capsys.readouterr().out
    assert (tmp_path / "train_000000.bin").read_bytes() == before


def test_a_folder_prepared_without_validation_is_not_prepared_again(tmp_path, bpe_json, capsys):
    """--val-fraction 0 writes train shards alone: a rerun took the folder as incomplete and
    tokenized everything again, and replaced another tokenizer's shards without a word.
    """
    (tmp_path / "a.txt").write_text("line\n" * 100)
    first = prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.0)
    assert first is not None and not first.val_paths
    before = first.train_paths[0].stat().st_mtime_ns
    assert prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.0) is None
    assert "already in" in capsys.readouterr().out
    assert first.train_paths[0].stat().st_mtime_ns == before
    with pytest.raises(UsageError, match="already holds shards written by the byte tokenizer"):
        prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.0, tokenizer=bpe_json)
    # Asked for validation now, it is rebuilt with the same tokenizer, never with another.
    with pytest.raises(UsageError, match="already holds shards written by the byte tokenizer"):
        prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.1, tokenizer=bpe_json)
    assert prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.1).val_paths
    assert "has no val shards; rebuilding them" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["train", "val"])
def test_shards_of_one_kind_that_prepare_did_not_write_are_not_replaced(tmp_path, kind):
    """Both kinds of record-less shards were kept, but one kind alone was overwritten and the
    rest deleted, as if an earlier prepare had left them.
    """
    from speedtronic_data import write_shard

    (tmp_path / "a.txt").write_text("line\n" * 100)
    mine = [
        write_shard(tmp_path / "out" / f"{kind}_{n:06d}.bin", torch.arange(300)) for n in (0, 1)
    ]
    before = [path.read_bytes() for path in mine]
    with pytest.raises(UsageError, match=f"out holds {kind} shards that speedtronic prepare did"):
        prepare_corpus(tmp_path / "out", [tmp_path / "a.txt"], 0, 0.1)
    assert [path.read_bytes() for path in mine] == before
