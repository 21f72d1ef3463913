from __future__ import annotations

from speedtronic_config.tokenizer_identity import describe_apart, describe_tokenizer, encode_alike

BPE = {"kind": "tokenizers", "vocab_size": 50257, "name": "tokenizer.json", "sha256": "ab"}


def test_byte_tokenizers_encode_alike_whatever_vocabulary_they_record():
    small = {"kind": "bytes", "vocab_size": 200, "name": "bytes", "sha256": None}
    old = {"kind": "bytes", "vocab_size": None, "name": "bytes", "sha256": None}
    assert encode_alike(small, old) and encode_alike(old, small)
    assert not encode_alike(small, BPE)


def test_a_tokenizers_file_is_known_by_size_and_hash_not_by_where_it_lies():
    assert encode_alike(BPE, {**BPE, "name": "elsewhere/tokenizer.json"})
    assert not encode_alike(BPE, {**BPE, "sha256": "cd"})
    assert not encode_alike(BPE, {**BPE, "vocab_size": 50304})


def test_a_custom_tokenizer_is_known_by_its_class_name():
    custom = {"kind": "custom", "vocab_size": 1000, "name": "mypkg.Tok", "sha256": None}
    assert encode_alike(custom, dict(custom))
    assert not encode_alike(custom, {**custom, "name": "mypkg.Other"})


def test_descriptions_name_the_tokenizer_and_its_ids():
    assert describe_tokenizer(BPE) == "tokenizer.json (50,257 ids)"
    byte = {"kind": "bytes", "vocab_size": 256}
    assert describe_tokenizer(byte) == "the byte tokenizer (256 ids)"
    assert describe_tokenizer({"kind": "custom", "name": "m.T"}) == "m.T (vocabulary unknown)"


def test_two_tokenizers_that_read_alike_are_told_apart_by_their_hash():
    other = {**BPE, "sha256": "cd" * 32}
    assert describe_apart(BPE, other) == (
        f"tokenizer.json (50,257 ids, sha256 {BPE['sha256'][:12]})",
        "tokenizer.json (50,257 ids, sha256 cdcdcdcdcdcd)",
    )
    byte = {"kind": "bytes", "vocab_size": 256}
    described = ("tokenizer.json (50,257 ids)", "the byte tokenizer (256 ids)")
    assert describe_apart(BPE, byte) == described  # told apart already
