"""tokenizer_record.json: written by prepare_shards, read by training and export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from speedtronic_data import (
    CharTokenizer,
    DataError,
    JsonTokenizer,
    TokenShardDataset,
    load_tokenizer,
    write_hf_tokenizer,
    write_shard,
)
from speedtronic_data.tokenizer_record import (
    RECORD_NAME,
    check_vocab,
    read_record,
    record_for,
    record_from_identity,
    shards_record,
    write_record,
)


def test_byte_tokenizer_record(tmp_path):
    record = write_record(tmp_path, CharTokenizer(512))
    assert (record.kind, record.vocab_size, record.folder) == ("bytes", 256, tmp_path)
    assert json.loads((tmp_path / RECORD_NAME).read_text()) == {
        "format": 1,
        "kind": "bytes",
        "vocab_size": 256,
        "name": "bytes",
    }
    assert read_record(tmp_path) == record
    assert record_for(CharTokenizer(128)).vocab_size == 128  # a cut vocabulary is what it emits
    assert type(load_tokenizer(record)) is CharTokenizer


def test_tokenizers_record_keeps_an_exact_copy(tmp_path, bpe_json):
    (tmp_path / "out").mkdir()
    tokenizer = JsonTokenizer.from_file(bpe_json)
    record = write_record(tmp_path / "out", tokenizer)
    assert record.kind == "tokenizers" and record.vocab_size == tokenizer.vocab_size > 256
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    assert read_record(tmp_path / "out").same_tokenizer(record)
    assert record.describe() == f"tokenizer.json ({tokenizer.vocab_size} ids)"
    loaded = load_tokenizer(read_record(tmp_path / "out"))
    assert loaded.encode("def add") == JsonTokenizer.from_file(bpe_json).encode("def add")
    # a later byte-level prepare into the same folder removes the copy
    write_record(tmp_path / "out", CharTokenizer())
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_a_folder_without_a_record_is_bytes_with_an_unknown_vocabulary(tmp_path):
    record = read_record(tmp_path)
    assert (record.kind, record.vocab_size) == ("bytes", None)
    check_vocab(record, 7, "anywhere")  # unknown: not checked (2.0 folders, cut vocabularies)


def test_custom_tokenizers_are_recorded_by_name(tmp_path):
    class Words:
        vocab_size = 1000

        def encode(self, text):
            return [1]

    record = write_record(tmp_path, Words())
    assert record.kind == "custom" and record.vocab_size == 1000 and "Words" in record.name
    with pytest.raises(DataError, match="no tokenizer.json"):
        load_tokenizer(record)


def test_unreadable_or_incomplete_records(tmp_path):
    (tmp_path / RECORD_NAME).write_text("{not json")
    with pytest.raises(DataError, match="unreadable"):
        read_record(tmp_path)
    (tmp_path / RECORD_NAME).write_text(
        json.dumps({"kind": "tokenizers", "vocab_size": 9, "name": "t", "sha256": "x"})
    )
    with pytest.raises(DataError, match="tokenizer.json, which is missing"):
        read_record(tmp_path)


def shards(folder, tokenizer, count=2000):
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder / "train_000000.bin", np.arange(count) % 200)
    write_record(folder, tokenizer)
    return folder


def test_training_refuses_a_vocabulary_smaller_than_the_tokenizer(tmp_path, bpe_json):
    size = JsonTokenizer.from_file(bpe_json).vocab_size
    folder = shards(tmp_path / "bpe", JsonTokenizer.from_file(bpe_json))
    with pytest.raises(DataError) as caught:
        TokenShardDataset(str(folder / "train_*.bin"), 16, vocab_size=256)
    message = str(caught.value)
    assert f"tokenizer.json ({size} ids)" in message and "is 256" in message
    assert f"data.vocab_size, if set) to at least {size}" in message and "\n" not in message
    assert TokenShardDataset(str(folder / "train_*.bin"), 16, vocab_size=320).tokenizer.kind == (
        "tokenizers"
    )


def test_shards_from_different_tokenizers_do_not_mix(tmp_path, bpe_json):
    shards(tmp_path / "a", CharTokenizer())
    shards(tmp_path / "b", JsonTokenizer.from_file(bpe_json))
    paths = [tmp_path / "a" / "train_000000.bin", tmp_path / "b" / "train_000000.bin"]
    with pytest.raises(DataError, match="different tokenizers") as caught:
        shards_record(paths)
    assert f"{tmp_path / 'a'} holds the byte tokenizer" in str(caught.value)
    with pytest.raises(DataError, match="different tokenizers"):
        TokenShardDataset([str(p) for p in paths], 16, 512)


def test_identity_round_trips_and_byte_tokenizers_encode_alike(tmp_path, bpe_json):
    bpe = write_record(tmp_path / "bpe", JsonTokenizer.from_file(bpe_json))
    again = record_from_identity(bpe.identity())
    assert again.same_tokenizer(bpe) and again.folder is None
    old_bytes = read_record(tmp_path / "pre-2.1")  # no record: vocabulary unknown
    assert old_bytes.encodes_alike(record_for(CharTokenizer(128)))
    assert not old_bytes.same_tokenizer(record_for(None))
    assert not bpe.encodes_alike(old_bytes)
    with pytest.raises(DataError, match="tokenizer entry .* is malformed .*KeyError"):
        record_from_identity({"kind": "bytes"})


def test_the_training_tokenizer_of_each_source(tmp_path, bpe_json):
    from speedtronic_data import run_tokenizer, training_tokenizer

    folder = shards(tmp_path / "bpe", JsonTokenizer.from_file(bpe_json))
    glob = str(folder / "train_*.bin")
    for setting in ("shard_path", "dataset"):
        section = {"block_size": 16, setting: glob}
        assert run_tokenizer(section).kind == training_tokenizer(section).kind == "tokenizers"
    text = {"block_size": 16, "text_path": "corpus.txt", "dataset": glob}  # text comes first
    assert run_tokenizer(text).kind == training_tokenizer(text).kind == "bytes"
    passed = JsonTokenizer.from_file(bpe_json)  # as build_dataloader(tokenizer=) takes it
    assert training_tokenizer({"block_size": 16, "text_path": "c.txt"}, passed).kind == (
        "tokenizers"
    )
    assert training_tokenizer({"block_size": 16, "synthetic": True}) is None


def test_tokenizers_that_map_text_alike_encode_alike_whatever_their_bytes(tmp_path, bpe_json):
    from tokenizers import Tokenizer

    bpe = write_record(tmp_path / "bpe", JsonTokenizer.from_file(bpe_json))
    compact = Tokenizer.from_file(str(bpe_json)).to_str(pretty=False)  # other bytes, same rules
    resaved = write_record(tmp_path / "resaved", JsonTokenizer(compact))
    assert not resaved.same_tokenizer(bpe) and resaved.encodes_alike(bpe)
    assert not bpe.encodes_alike(write_record(tmp_path / "bytes", CharTokenizer()))
    fewer = json.loads(bpe_json.read_text())
    fewer["model"]["merges"] = fewer["model"]["merges"][:-1]  # one merge short: other ids
    cut = write_record(tmp_path / "cut", JsonTokenizer(json.dumps(fewer)))
    assert not cut.encodes_alike(bpe)
    # A byte tokenizer.json (as export writes) maps text as the byte tokenizer does.
    write_hf_tokenizer(tmp_path / "hf", CharTokenizer(), model_max_length=32)
    exported = write_record(
        tmp_path / "exported", JsonTokenizer.from_file(tmp_path / "hf" / "tokenizer.json")
    )
    assert exported.encodes_alike(write_record(tmp_path / "bytes", CharTokenizer()))


def test_byte_level_shards_mix_with_and_without_a_record(tmp_path):
    # A folder prepared with the byte tokenizer and shards written by write_shard alone (no
    # record, vocabulary unknown) were refused as "different tokenizers: the byte tokenizer
    # (vocabulary unknown), the byte tokenizer (256 ids)".
    import inspect

    text = inspect.getsource(inspect).encode("utf-8")
    shards(tmp_path / "prepared", CharTokenizer())
    (tmp_path / "mine").mkdir()
    write_shard(tmp_path / "mine" / "part_0.bin", np.frombuffer(text, dtype=np.uint8))
    globs = [str(tmp_path / "prepared" / "*.bin"), str(tmp_path / "mine" / "*.bin")]
    dataset = TokenShardDataset(globs, 64, vocab_size=256)
    assert (dataset.tokenizer.kind, dataset.tokenizer.vocab_size) == ("bytes", None)
    assert len(dataset) == (2000 - 1) // 64 + (len(text) - 1) // 64
    with pytest.raises(DataError, match=r"holds token id \d+ >= vocab_size 128"):
        TokenShardDataset(globs, 64, vocab_size=128)  # still checked, shard by shard
    shards(tmp_path / "cut", CharTokenizer(200))
    cut = shards_record(
        [tmp_path / "cut" / "train_000000.bin", tmp_path / "prepared" / "train_000000.bin"]
    )
    assert (cut.kind, cut.vocab_size) == ("bytes", 256)
