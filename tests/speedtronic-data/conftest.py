from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n" * 40


@pytest.fixture(scope="session")
def bpe_json(tmp_path_factory) -> Path:
    """A real byte-level BPE tokenizer.json (more than 256 ids, <|endoftext|> = 0) trained here."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS], trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="session")
def metaspace_json(tmp_path_factory) -> Path:
    """A real SentencePiece-style BPE tokenizer.json (Metaspace: " " becomes "▁") trained here."""
    pytest.importorskip("tokenizers")
    from tokenizers.implementations import SentencePieceBPETokenizer

    tokenizer = SentencePieceBPETokenizer()
    tokenizer.train_from_iterator([CORPUS], vocab_size=300, show_progress=False)
    path = tmp_path_factory.mktemp("metaspace") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="session")
def unigram_json(tmp_path_factory) -> Path:
    """A real SentencePiece-style Unigram tokenizer.json trained here: Metaspace, and a normalizer
    that makes a run of spaces one.
    """
    pytest.importorskip("tokenizers")
    from tokenizers.implementations import SentencePieceUnigramTokenizer

    tokenizer = SentencePieceUnigramTokenizer()
    tokenizer.train_from_iterator(
        [CORPUS], vocab_size=100, show_progress=False, unk_token="<unk>", special_tokens=["<unk>"]
    )
    path = tmp_path_factory.mktemp("unigram") / "tokenizer.json"
    tokenizer.save(str(path))
    return path
