from __future__ import annotations

import numpy as np
import pytest

from speedtronic_data import (
    DataError,
    TokenShardDataset,
    prepare_shards,
    read_shard_tokens,
    stdlib_corpus,
)


def _tokens(paths) -> list[int]:
    return [int(t) for p in paths for t in read_shard_tokens(p)]


def test_files_and_texts_become_train_and_val_shards(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("".join(f"line {i}\n" for i in range(1000)))
    lines = []
    result = prepare_shards(
        [source],
        tmp_path / "out",
        val_fraction=0.1,
        shard_tokens=2000,
        texts=["extra text\n"],
        progress=lines.append,
    )
    data = source.read_bytes() + b"extra text\n"
    assert result.train_tokens + result.val_tokens == len(data)
    assert 0 < result.val_tokens < len(data) // 5
    assert sorted(_tokens(result.val_paths) + _tokens(result.train_paths)) == sorted(data)
    val = bytes(_tokens(result.val_paths))
    # Validation is the head of each source, rounded up to a whole line (so the one-line text is all
    # val).
    assert val == source.read_bytes()[: len(val) - 11] + b"extra text\n" and val.count(b"\n") > 50
    assert [p.name for p in result.train_paths][:2] == ["train_000000.bin", "train_000001.bin"]
    assert all(len(read_shard_tokens(p)) == 2000 for p in result.train_paths[:-1])
    assert len(lines) == len(result.train_paths) + len(result.val_paths) and "tokens/s" in lines[0]
    assert len(TokenShardDataset(str(tmp_path / "out" / "train_*.bin"), 16)) > 0


def test_rerun_removes_stale_shards_and_custom_tokenizer(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("word " * 5000)
    first = prepare_shards([source], tmp_path, shard_tokens=1000, progress=None)
    assert len(first.train_paths) > 3
    second = prepare_shards(
        [source],
        tmp_path,
        tokenizer=lambda t: [7] * len(t.split()),
        shard_tokens=10**6,
        progress=None,
    )
    assert (
        sorted(tmp_path.glob("train_*.bin")) == second.train_paths and len(second.train_paths) == 1
    )
    assert set(_tokens(second.train_paths)) == {7}


def test_bad_arguments(tmp_path):
    with pytest.raises(DataError, match="val_fraction"):
        prepare_shards([], tmp_path, val_fraction=1.0)
    with pytest.raises(DataError, match="no text"):
        prepare_shards([], tmp_path, progress=None)
    with pytest.raises(DataError, match="does not exist"):
        prepare_shards([tmp_path / "missing.txt"], tmp_path)
    with pytest.raises(DataError, match="shard_tokens"):
        prepare_shards([], tmp_path, shard_tokens=0)


def test_hugging_face_tokenizer_vocab_is_enforced(tmp_path):
    class Tok:
        def get_vocab_size(self):
            return 10

        def encode(self, text):
            return [len(w) for w in text.split()]

    (tmp_path / "a.txt").write_text("a bb ccccccccccccccc")
    with pytest.raises(DataError, match="token id 15 is >= vocab_size 10"):
        prepare_shards([tmp_path / "a.txt"], tmp_path / "out", tokenizer=Tok(), progress=None)


def test_stdlib_corpus_is_deterministic_python_source_of_the_requested_size():
    text = stdlib_corpus(200_000)
    assert len(text.encode("utf-8")) <= 200_000 and len(text.encode("utf-8")) > 190_000
    assert text == stdlib_corpus(200_000)
    assert stdlib_corpus(50_000) == text.encode("utf-8")[:50_000].decode("utf-8", errors="ignore")
    assert "def " in text and "import " in text
    assert np.frombuffer(text.encode("utf-8"), dtype=np.uint8).max() < 256
