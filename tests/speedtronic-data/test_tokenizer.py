from __future__ import annotations

import pytest

from speedtronic_data import CharTokenizer, DataError
from speedtronic_data.tokenizer import encode_text


def test_char_tokenizer_round_trips_utf8_bytes():
    tok = CharTokenizer()
    ids = tok.encode("héllo")
    assert ids == list("héllo".encode()) and tok("héllo") == ids
    assert tok.decode(ids) == "héllo"


def test_small_vocab_rejects_large_bytes_naming_id_and_vocab():
    with pytest.raises(DataError, match=r"token id 195 is >= vocab_size 128"):
        CharTokenizer(vocab_size=128).encode("é")
    assert CharTokenizer(vocab_size=128).encode("abc") == [97, 98, 99]


def test_bad_vocab_size():
    with pytest.raises(DataError, match="vocab_size must be positive"):
        CharTokenizer(vocab_size=0)
    with pytest.raises(DataError, match="CharTokenizer vocab_size must be a positive integer"):
        CharTokenizer(vocab_size="256")


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class _HFLike:
    def encode(self, text):
        return _Encoding([len(word) for word in text.split()])


@pytest.mark.parametrize("tokenizer", [lambda text: [len(text)], _HFLike()])
def test_encode_text_accepts_callables_and_encode_objects(tokenizer):
    assert encode_text(tokenizer, "ab cde") in ([6], [2, 3])


def test_encode_text_rejects_non_tokenizer():
    with pytest.raises(DataError, match="neither callable nor has encode"):
        encode_text(object(), "x")


def test_hugging_face_tokenizer_adapter():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    assert encode_text(tok, "a b zz a") == [0, 1, 2, 0]


def test_json_tokenizer_reads_a_tokenizer_json(bpe_json):
    from speedtronic_data import JsonTokenizer

    tok = JsonTokenizer.from_file(bpe_json)
    ids = tok.encode("return a + b")
    assert tok.decode(ids) == "return a + b" and tok("x") == tok.encode("x")
    assert tok.vocab_size > 256 and max(ids) < tok.vocab_size


def test_json_tokenizer_bad_inputs(tmp_path):
    from speedtronic_data import JsonTokenizer

    pytest.importorskip("tokenizers")
    with pytest.raises(DataError, match="does not exist"):
        JsonTokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "t.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(DataError, match=r"is not a tokenizers tokenizer.json \(.*\); pass the"):
        JsonTokenizer.from_file(tmp_path / "t.json")
    (tmp_path / "gz.json").write_bytes(b"\x1f\x8b\x08 gzip")  # was a bare UnicodeDecodeError
    with pytest.raises(DataError, match=r"gz.json is not a .*\(not UTF-8 text at byte 1\); pass"):
        JsonTokenizer.from_file(tmp_path / "gz.json")


def test_missing_tokenizers_names_the_extra(tmp_path, monkeypatch):
    import sys

    from speedtronic_data import JsonTokenizer

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now raises ImportError
    with pytest.raises(DataError, match=r"pip install 'speedtronic-data\[tokenizers\]'"):
        JsonTokenizer("{}")
