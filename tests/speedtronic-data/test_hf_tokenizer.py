"""The byte tokenizer as a tokenizers tokenizer.json: ids and decoding equal ours, checked with the
real `tokenizers` and `transformers` (each skipped where not installed).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speedtronic_data import CharTokenizer, DataError, JsonTokenizer, write_hf_tokenizer
from speedtronic_data.hf_tokenizer import (
    byte_level_tokenizer_json,
    bytes_to_unicode,
    special_tokens,
)


@pytest.fixture(scope="module")
def exported():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_str(json.dumps(byte_level_tokenizer_json()))


def test_the_byte_table_is_gpt2s():
    table = bytes_to_unicode()
    assert len(table) == len(set(table.values())) == 256
    assert (table[ord("A")], table[ord(" ")], table[0], table[255]) == ("A", "Ġ", "Ā", "ÿ")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_ids_equal_ours_for_any_text(exported, text):
    assert exported.encode(text).ids == CharTokenizer().encode(text)


# ids up to 299: a vocabulary larger than 256 leaves ids that stand for no byte
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 299), max_size=40) | st.binary(max_size=40).map(list))
def test_decoding_equals_ours_for_any_ids(exported, ids):
    # arbitrary bytes include invalid UTF-8: both replace it with U+FFFD the same way
    assert exported.decode(ids) == CharTokenizer(512).decode(ids)


def test_ids_past_255_decode_to_nothing():
    assert CharTokenizer(512).decode([104, 300, 105, 256]) == "hi"


def test_autotokenizer_loads_the_export_and_agrees(tmp_path):
    transformers = pytest.importorskip("transformers")
    assert write_hf_tokenizer(tmp_path, CharTokenizer(), model_max_length=64) == (None, None)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "x = f(a , b) . isn 't it ? héllo 🎉\n\t\x00"
    ids = CharTokenizer().encode(text)
    assert loaded(text)["input_ids"] == ids
    assert loaded.decode(ids) == text  # no clean-up of " ." or " 't"
    assert loaded.model_max_length == 64 and len(loaded) == 256


def test_a_tokenizers_json_is_copied_through_byte_for_byte(tmp_path, bpe_json):
    transformers = pytest.importorskip("transformers")
    ids = write_hf_tokenizer(tmp_path, JsonTokenizer.from_file(bpe_json), model_max_length=32)
    assert (tmp_path / "tokenizer.json").read_bytes() == bpe_json.read_bytes()
    assert ids == (0, 0)  # GPT-2 style: <|endoftext|> begins and ends sequences
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = JsonTokenizer.from_file(bpe_json)
    text = "def add(a, b):\n    return a + b\n"
    assert loaded(text)["input_ids"] == ours.encode(text)
    assert loaded.decode(ours.encode(text)) == ours.decode(ours.encode(text)) == text
    assert loaded.eos_token == "<|endoftext|>"


def test_special_tokens_by_their_usual_names():
    added = [
        {"id": 1, "content": "<s>", "special": True},
        {"id": 2, "content": "</s>", "special": True},
        {"id": 3, "content": "<unk>", "special": True},
    ]
    assert special_tokens({"added_tokens": added}) == (("<s>", 1), ("</s>", 2))
    assert special_tokens({"added_tokens": [{**added[1], "special": False}]}) == (None, None)


def test_a_python_tokenizer_cannot_be_exported(tmp_path):
    with pytest.raises(DataError, match="has no tokenizer.json to export"):
        write_hf_tokenizer(tmp_path, lambda text: [1], model_max_length=8)
