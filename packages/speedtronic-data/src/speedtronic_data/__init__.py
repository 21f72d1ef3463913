"""Speedtronic data: tokenizers, synthetic/text/shard datasets, causal collation and resumable
loaders.
"""

from __future__ import annotations

from speedtronic_data.__about__ import __version__
from speedtronic_data.collate import collate_batch, collate_causal, infinite_batches
from speedtronic_data.errors import DataError
from speedtronic_data.hf_tokenizer import write_hf_tokenizer
from speedtronic_data.loader import (
    ResumableLoader,
    ResumableSampler,
    build_dataloader,
    build_eval_dataloader,
    loader_state,
    restore_loader,
    run_tokenizer,
    training_tokenizer,
)
from speedtronic_data.prepare import PrepareResult, prepare_shards, stdlib_corpus
from speedtronic_data.shards import (
    TokenShardDataset,
    read_shard_header,
    read_shard_tokens,
    write_shard,
)
from speedtronic_data.synthetic import SyntheticTokenDataset
from speedtronic_data.text import TextFileTokenDataset
from speedtronic_data.tokenizer import CharTokenizer, JsonTokenizer
from speedtronic_data.tokenizer_record import TokenizerRecord, load_tokenizer

__all__ = [
    "CharTokenizer",
    "DataError",
    "JsonTokenizer",
    "PrepareResult",
    "ResumableLoader",
    "ResumableSampler",
    "SyntheticTokenDataset",
    "TextFileTokenDataset",
    "TokenShardDataset",
    "TokenizerRecord",
    "__version__",
    "build_dataloader",
    "build_eval_dataloader",
    "collate_batch",
    "collate_causal",
    "infinite_batches",
    "load_tokenizer",
    "loader_state",
    "prepare_shards",
    "read_shard_header",
    "read_shard_tokens",
    "restore_loader",
    "run_tokenizer",
    "stdlib_corpus",
    "training_tokenizer",
    "write_hf_tokenizer",
    "write_shard",
]
