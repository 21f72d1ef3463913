from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speedtronic_data import (
    DataError,
    ResumableLoader,
    TokenShardDataset,
    read_shard_header,
    read_shard_tokens,
    write_shard,
)
from speedtronic_data.shards import HEADER_BYTES, MAX_OPEN_SHARDS, open_shard_limit


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
    assert ds[0]["input_ids"].tolist() == [0, 1, 2, 3, 4] and ds[0]["labels"].tolist() == [
        1,
        2,
        3,
        4,
        5,
    ]
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
    with pytest.raises(
        DataError, match=r"promises 10 tokens \(20 bytes\) but the body has 8 bytes"
    ):
        read_shard_header(_raw(tmp_path / "cut.bin", [20240520, 1, 10], b"\0" * 8))


def test_no_match_short_data_and_vocab(tmp_path):
    with pytest.raises(DataError, match="matches no files.*speedtronic prepare"):
        TokenShardDataset(str(tmp_path / "train_*.bin"), 8)
    with pytest.raises(DataError, match=r"^data.val_shard_path = .* is a folder; .*train_\*.bin"):
        TokenShardDataset(str(tmp_path), 8, setting="data.val_shard_path")
    write_shard(tmp_path / "short.bin", np.arange(5))
    with pytest.raises(DataError, match=r"at most 5 tokens each, fewer than block_size \+ 1 = 9"):
        TokenShardDataset(tmp_path / "short.bin", 8)
    write_shard(tmp_path / "v.bin", np.array([1, 2, 3, 300, 4, 5, 6, 7, 8, 9]))
    with pytest.raises(DataError, match=r"v.bin' holds token id 300 >= vocab_size 256"):
        TokenShardDataset(tmp_path / "v.bin", 4, vocab_size=256)


# ------------------------------------------------------------------------------------------------
# the largest id, recorded in the header


def test_the_header_records_the_largest_id(tmp_path):
    info = read_shard_header(write_shard(tmp_path / "a.bin", np.array([5, 60_000, 7])))
    assert (info.dtype, info.max_token) == (np.dtype("<u2"), 60_000)
    assert read_shard_header(write_shard(tmp_path / "b.bin", [3, 70_000])).max_token == 70_000
    # llm.c reads slots 0-2 and its writers leave the rest zero; ours is slot 3, id + 1
    header = np.fromfile(tmp_path / "b.bin", dtype="<i4", count=256)
    assert header[:4].tolist() == [20240801, 7, 2, 70_001] and not header[4:].any()
    # nothing to record, or no room for id + 1 in the slot: unknown, so scanned
    assert read_shard_header(write_shard(tmp_path / "c.bin", [])).max_token is None
    assert read_shard_header(write_shard(tmp_path / "d.bin", [0, 2**32 - 1])).max_token is None


def test_a_recorded_largest_id_is_trusted_without_reading_the_body(tmp_path, monkeypatch):
    path = write_shard(tmp_path / "s.bin", np.arange(10))
    header = np.fromfile(path, dtype="<i4", count=256)
    header[3] = 301  # the body's largest id is 9; the header says 300
    with open(path, "r+b") as handle:
        handle.write(header.tobytes())
    with pytest.raises(DataError, match=r"s.bin' holds token id 300 >= vocab_size 256"):
        TokenShardDataset(path, 4, vocab_size=256)

    def no_scan(path):
        raise AssertionError(f"{path} was read to find its largest id")

    monkeypatch.setattr("speedtronic_data.shards.read_shard_tokens", no_scan)
    assert len(TokenShardDataset(path, 4, vocab_size=301)) == 2


def test_a_shard_that_records_no_largest_id_is_scanned(tmp_path):
    tokens = np.array([1, 2, 3, 300, 4, 5, 6, 7, 8, 9], dtype="<u2")
    path = _raw(tmp_path / "llmc.bin", [20240520, 1, len(tokens)], tokens.tobytes())  # as llm.c
    assert read_shard_header(path).max_token is None
    with pytest.raises(DataError, match=r"llmc.bin' holds token id 300 >= vocab_size 256"):
        TokenShardDataset(path, 4, vocab_size=256)


def test_an_impossible_recorded_largest_id_is_refused(tmp_path):
    path = _raw(tmp_path / "top.bin", [20240520, 1, 2, 2**16], b"\0" * 4)
    assert read_shard_header(path).max_token == 2**16 - 1  # the most a uint16 shard can hold
    path = _raw(tmp_path / "bad.bin", [20240520, 1, 2, 2**16 + 1], b"\0" * 4)
    with pytest.raises(
        DataError,
        match=r"^token shard .*bad.bin' header records largest token id 65536, more than its "
        r"uint16 tokens can hold; the header is corrupt: write it again$",
    ):
        read_shard_header(path)


def test_write_shard_rejects_bad_ids(tmp_path):
    with pytest.raises(DataError, match="1-D"):
        write_shard(tmp_path / "x.bin", np.zeros((2, 2)))
    with pytest.raises(DataError, match="must lie in"):
        write_shard(tmp_path / "x.bin", np.array([-1, 2]))


# ------------------------------------------------------------------------- whole batches against a
# reference


def _reference_windows(paths, block_size):
    """Every window by the format's definition, read with plain file I/O (not through the
    dataset).
    """
    windows = []
    for path in paths:
        magic = int(np.fromfile(path, dtype="<i4", count=1)[0])
        tokens = np.fromfile(path, dtype="<u2" if magic == 20240520 else "<u4", offset=HEADER_BYTES)
        windows += [
            tokens[i * block_size : (i + 1) * block_size + 1].astype(np.int64)
            for i in range((len(tokens) - 1) // block_size)
        ]
    return windows


@pytest.fixture
def mixed_shards(tmp_path):
    rng = np.random.default_rng(1)
    paths = [
        write_shard(tmp_path / "m_0.bin", rng.integers(0, 500, 203)),
        write_shard(tmp_path / "m_1.bin", rng.integers(0, 70_000, 97)),  # uint32 tokens
        write_shard(tmp_path / "m_2.bin", rng.integers(0, 500, 150)),
    ]
    return paths


@pytest.mark.parametrize(
    "indices",
    [
        [0, 1, 2, 3],
        [20, 21, 22, 23],
        [7, 3, 3, 12],
        [23, 24, 25],
        [40, 0, 20, 31, 5],
        np.array([8, 9]),
        range(10, 14),
    ],
)
def test_batches_equal_the_per_window_reference(mixed_shards, indices):
    ds = TokenShardDataset([str(p) for p in mixed_shards], block_size=8)
    reference = _reference_windows(mixed_shards, 8)
    assert len(ds) == len(reference) == 25 + 12 + 18
    batch = ds.__getitems__(indices)
    expected = np.stack([reference[i] for i in indices])
    assert batch.input_ids.dtype == batch.labels.dtype == torch.long
    assert batch.input_ids.is_contiguous() and batch.labels.is_contiguous()
    assert np.array_equal(batch.input_ids.numpy(), expected[:, :-1])
    assert np.array_equal(batch.labels.numpy(), expected[:, 1:])
    assert [ds[i]["labels"].tolist() for i in indices] == expected[:, 1:].tolist()


def test_batches_are_fresh_memory_not_the_memmap(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(100))
    ds = TokenShardDataset(tmp_path / "s.bin", block_size=4)
    batch = ds.__getitems__([0, 1])
    batch.input_ids.add_(1000)  # a consumer writing into its batch must not change the data
    assert ds.__getitems__([0, 1]).input_ids[0].tolist() == [0, 1, 2, 3]


def test_bad_batch_indices(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(100))
    ds = TokenShardDataset(tmp_path / "s.bin", block_size=4)
    with pytest.raises(IndexError, match="out of range for 24 windows"):
        ds.__getitems__([0, 24])
    with pytest.raises(IndexError, match="window index -1"):
        ds.batch([-1, 2])
    with pytest.raises(IndexError, match="at least one"):
        ds.batch([])


def test_an_id_late_in_any_shard_fails_when_the_dataset_is_built(tmp_path):
    # #19: an id >= vocab_size late in a shard was raised only when its batch was read (step 31).
    write_shard(tmp_path / "a.bin", np.arange(40) % 10)
    write_shard(tmp_path / "b.bin", np.r_[np.arange(3000) % 10, 77])
    with pytest.raises(DataError, match=r"b.bin' holds token id 77 >= vocab_size 64"):
        TokenShardDataset(str(tmp_path / "*.bin"), 5, vocab_size=64)
    ds = TokenShardDataset(str(tmp_path / "*.bin"), 5, vocab_size=78)
    assert ds.__getitems__([len(ds) - 1]).labels.max() == 77
    # a uint16 shard cannot hold an id >= 65536: nothing to scan
    assert len(TokenShardDataset(str(tmp_path / "a.bin"), 5, vocab_size=2**16))


def test_shards_get_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    path = write_shard(tmp_path / "s.bin", np.arange(10))
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # mkstemp made them 0600 (#19)
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


# ------------------------------------------------------------------------------------------------
# position


def test_state_round_trip_and_bad_states(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(100))
    ds = TokenShardDataset(tmp_path / "s.bin", block_size=4)
    # Nothing counts batches under a plain DataLoader: no state_dict, so the trainer replays
    # instead.
    assert not hasattr(ds, "state_dict")
    with pytest.raises(AttributeError, match="only while a ResumableLoader drives the dataset"):
        ds.state_dict()
    ds.load_state_dict(
        {"epoch": 2, "windows": 5, "num_windows": 24}
    )  # before the loader exists is fine
    loader = ResumableLoader(ds, batch_size=3)
    assert ds.state_dict() == {"epoch": 2, "windows": 5, "num_windows": 24}
    assert next(iter(loader))["input_ids"][:, 0].tolist() == [
        20,
        24,
        28,
    ]  # windows 5, 6, 7 of epoch 2
    assert ds.state_dict() == {"epoch": 2, "windows": 8, "num_windows": 24}
    with pytest.raises(DataError, match="not a TokenShardDataset state"):
        ds.load_state_dict({"epoch": 0})
    with pytest.raises(DataError, match="negative"):
        ds.load_state_dict({"epoch": 0, "windows": -3})
    with pytest.raises(DataError, match="saved over 30 windows but these shards hold 24"):
        ds.load_state_dict({"epoch": 0, "windows": 3, "num_windows": 30})


def test_sizes_of_the_wrong_type_are_named(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(50) % 7)
    for sizes, fragment in (((8.0,), "block_size"), ((8, "256"), "vocab_size")):
        with pytest.raises(DataError, match=f"TokenShardDataset {fragment} must be a positive int"):
            TokenShardDataset(tmp_path / "s.bin", *sizes)


# ------------------------------------------------------------------------------------------------
# many shards: at most open_shard_limit() maps (each holds a descriptor) are open at once

_READ_ALL_UNDER_A_LOW_FILE_LIMIT = """
import resource, sys
import torch
from speedtronic_config import DataConfig
from speedtronic_data import build_dataloader
pattern, workers = sys.argv[1], int(sys.argv[2])
# Fewer than the shards, and no room to raise it: 32 maps at once, in each process.
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
section = DataConfig(shard_path=pattern, block_size=16, vocab_size=1 << 17, micro_batch_size=8,
    target_batch_size=8, num_workers=workers, shuffle=True, seed=0, drop_last=False)
starts = torch.cat([batch["input_ids"][:, 0] for batch in build_dataloader(section)])
print(sorted(starts.tolist()) == list(range(0, 400 * 256, 256)))  # each shard once
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_more_shards_than_the_open_file_limit_are_read(tmp_path, workers):
    # Shard i holds i * 256 + 0..16 as uint32, so a window's first token names its shard.
    for i in range(400):
        write_shard(tmp_path / f"train_{i:06d}.bin", i * 256 + np.arange(17))
    script = tmp_path / "read_all.py"
    script.write_text(_READ_ALL_UNDER_A_LOW_FILE_LIMIT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "train_*.bin"), str(workers)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"


def _mapped(folder) -> list[str]:
    """Return the permissions of this process's memory maps of files in folder."""
    with open("/proc/self/maps") as maps:
        return [line.split()[1] for line in maps if str(folder) in line]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc")
def test_at_most_max_open_shards_are_mapped(tmp_path, monkeypatch):
    for i in range(20):
        write_shard(tmp_path / f"s{i:02d}.bin", i * 1000 + np.arange(33))  # 4 windows of 8 each
    monkeypatch.setattr("speedtronic_data.shards.MAX_OPEN_SHARDS", 3)
    ds = TokenShardDataset(str(tmp_path / "s*.bin"), block_size=8)
    order = np.random.default_rng(0).permutation(len(ds)).tolist()
    for begin in range(0, len(order), 5):
        batch = order[begin : begin + 5]
        inputs = ds.batch(batch).input_ids
        expected = [(i // 4) * 1000 + (i % 4) * 8 + np.arange(8) for i in batch]
        assert np.array_equal(inputs.numpy(), np.stack(expected))
        assert len(ds._maps) <= 3 and len(_mapped(tmp_path)) <= 3  # evicted maps are unmapped
        # Shared and read-only: a private map would commit each whole shard, which a host that
        # does not overcommit memory refuses.
        assert set(_mapped(tmp_path)) == {"r--s"}
    clone = pickle.loads(pickle.dumps(ds))  # into a worker: no maps, the same limit
    assert len(clone._maps) == 0 and clone._maps.limit == 3


def test_the_maps_open_at_once_leave_most_of_the_open_file_limit(monkeypatch):
    import resource

    limits = {}
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, new: limits.update(now=new))
    # (soft, hard) before, shards -> maps open at once, (soft, hard) after
    cases = [
        ((1024, 1024), 1500, 256, (1024, 1024)),  # no room to raise: a quarter of the limit
        ((1024, 20000), 1500, 1500, (6000, 20000)),  # raised as far as every shard needs
        ((1024, 4096), 1500, 1024, (4096, 4096)),  # raised to the hard limit
        ((1024, 4096), 100, 100, (1024, 4096)),  # enough already: unchanged
        ((40, 40), 100, 16, (40, 40)),
        ((1024, resource.RLIM_INFINITY), 10**5, MAX_OPEN_SHARDS, (4 * MAX_OPEN_SHARDS, -1)),
    ]
    for before, shards, maps, after in cases:
        limits["now"] = before
        assert (min(shards, open_shard_limit(shards)), limits["now"]) == (maps, after), before


def test_a_shard_changed_after_the_dataset_opened_is_named(tmp_path):
    write_shard(tmp_path / "s0.bin", np.arange(33))
    write_shard(tmp_path / "s1.bin", np.arange(33))
    ds = TokenShardDataset(str(tmp_path / "s*.bin"), block_size=8)
    ds.batch([0])
    write_shard(tmp_path / "s1.bin", np.arange(17))  # rewritten, with fewer tokens
    with pytest.raises(DataError, match=r"s1.bin' changed while it was being read: it held 33 "):
        ds.batch([4])
    with open(tmp_path / "s1.bin", "r+b") as handle:
        handle.truncate(HEADER_BYTES + 10)
    with pytest.raises(DataError, match=r"s1.bin' header promises 17 tokens .* truncated"):
        ds.batch([5])
    (tmp_path / "s1.bin").unlink()
    with pytest.raises(DataError, match=r"s1.bin' does not exist"):
        ds.batch([6])
    assert ds.batch([1]).input_ids.tolist() == [list(range(8, 16))]  # the open map reads on
