from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from speedtronic_data import DataError, TokenShardDataset, read_shard_header, read_shard_tokens, write_shard
from speedtronic_data.shards import HEADER_BYTES


def test_round_trip_uint16_and_uint32(tmp_path):
    small = np.arange(1000) % 60000
    info = read_shard_header(write_shard(tmp_path / "a.bin", small))
    assert (info.dtype, info.num_tokens) == (np.dtype("<u2"), 1000)
    assert np.array_equal(read_shard_tokens(tmp_path / "a.bin"), small)
    big = np.array([0, 70000, 2**32 - 1])
    info = read_shard_header(write_shard(tmp_path / "b.bin", big))
    assert info.dtype == np.dtype("<u4")
    assert np.array_equal(read_shard_tokens(tmp_path / "b.bin"), big)
    header = np.fromfile(tmp_path / "b.bin", dtype="<i4", count=3)
    assert header.tolist() == [20240801, 7, 3]
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temporary behind


def test_windows_follow_the_shards_and_never_cross_them(tmp_path):
    write_shard(tmp_path / "s0.bin", np.arange(0, 21))  # 21 tokens: (21-1)//5 = 4 windows
    write_shard(tmp_path / "s1.bin", np.arange(100, 112))  # 12 tokens: 2 windows
    ds = TokenShardDataset(str(tmp_path / "s*.bin"), block_size=5)
    assert len(ds) == 6 and ds.num_tokens == 33
    assert ds[0]["input_ids"].tolist() == [0, 1, 2, 3, 4] and ds[0]["labels"].tolist() == [1, 2, 3, 4, 5]
    assert ds[3]["labels"].tolist() == [16, 17, 18, 19, 20]
    assert ds[4]["input_ids"].tolist() == [100, 101, 102, 103, 104]
    assert ds[-1]["labels"].tolist() == [106, 107, 108, 109, 110]
    batch = ds.__getitems__([5, 0, 4])
    assert [row["input_ids"][0].item() for row in batch] == [105, 0, 100]
    assert batch[0]["input_ids"].dtype == torch.long
    with pytest.raises(IndexError):
        ds[6]


def test_dataset_pickles_without_copying_the_memmap(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(10_000))
    ds = TokenShardDataset(tmp_path / "s.bin", block_size=8)
    ds[0]  # opens the memmap
    clone = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 10_000 and torch.equal(clone[7]["input_ids"], ds[7]["input_ids"])


def _raw(path, header, body: bytes):
    full = np.zeros(256, dtype="<i4")
    full[: len(header)] = header
    path.write_bytes(full.tobytes() + body)
    return path


def test_bad_shards_are_named(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_shard_header(tmp_path / "missing.bin")
    (tmp_path / "tiny.bin").write_bytes(b"\0" * 10)
    with pytest.raises(DataError, match=f"shorter than its {HEADER_BYTES}-byte header"):
        read_shard_header(tmp_path / "tiny.bin")
    with pytest.raises(DataError, match=r"magic.bin' has magic 12345"):
        read_shard_header(_raw(tmp_path / "magic.bin", [12345, 1, 0], b""))
    with pytest.raises(DataError, match="has version 7; magic 20240520 needs version 1"):
        read_shard_header(_raw(tmp_path / "version.bin", [20240520, 7, 0], b""))
    with pytest.raises(DataError, match=r"promises 10 tokens \(20 bytes\) but the body has 8 bytes"):
        read_shard_header(_raw(tmp_path / "cut.bin", [20240520, 1, 10], b"\0" * 8))


def test_no_match_short_data_and_vocab(tmp_path):
    with pytest.raises(DataError, match="matches no files.*speedtronic prepare"):
        TokenShardDataset(str(tmp_path / "train_*.bin"), 8)
    write_shard(tmp_path / "short.bin", np.arange(5))
    with pytest.raises(DataError, match=r"at most 5 tokens each, fewer than block_size \+ 1 = 9"):
        TokenShardDataset(tmp_path / "short.bin", 8)
    write_shard(tmp_path / "v.bin", np.array([1, 2, 3, 300, 4, 5, 6, 7, 8, 9]))
    ds = TokenShardDataset(tmp_path / "v.bin", 4, vocab_size=256)
    with pytest.raises(DataError, match=r"v.bin' holds token id 300 >= vocab_size 256"):
        ds[0]


def test_write_shard_rejects_bad_ids(tmp_path):
    with pytest.raises(DataError, match="1-D"):
        write_shard(tmp_path / "x.bin", np.zeros((2, 2)))
    with pytest.raises(DataError, match="must lie in"):
        write_shard(tmp_path / "x.bin", np.array([-1, 2]))
