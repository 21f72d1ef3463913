"""Fixtures of the meta-package tests; interop_testkit is importable (--import-mode=importlib)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# A suite started as a script's background job (`pytest ... &`) inherits SIGINT ignored, which
# Python keeps: the Ctrl-C tests, and the processes they start, need Python's default handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The tests expect the resume command a plain shell prints, also when the suite runs under
# `hatch run` (whose environment makes it `hatch run speedtronic ...`). Dropped at import, before
# any test module copies os.environ for the processes it starts.
os.environ.pop("HATCH_ENV_ACTIVE", None)


@pytest.fixture
def wandb_offline(monkeypatch):
    """W&B in offline mode for the test. wandb reads WANDB_MODE once per process, into the
    setup it keeps until teardown: torn down before (an earlier test's online setup) and after.
    """
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()
    yield wandb
    wandb.teardown()


@pytest.fixture(scope="session")
def byte_shards(tmp_path_factory) -> Path:
    """A folder of byte-level train/val shards (with its tokenizer record) of stdlib source."""
    from speedtronic_data import prepare_shards, stdlib_corpus

    out = tmp_path_factory.mktemp("byte-shards")
    prepare_shards([], out, val_fraction=0.1, texts=[stdlib_corpus(60_000)], progress=None)
    return out


@pytest.fixture(scope="session")
def bpe_json(tmp_path_factory) -> Path:
    """A real byte-level BPE tokenizer.json (more than 256 ids, <|endoftext|> = 0) trained here."""
    tokenizers = pytest.importorskip("tokenizers")
    from interop_testkit import BPE_CORPUS
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
    tokenizer.train_from_iterator([BPE_CORPUS], trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return path
