from __future__ import annotations

import numpy as np
import pytest
import torch

from speedtronic_data import DataError, SyntheticTokenDataset


def test_shapes_shift_and_range():
    ds = SyntheticTokenDataset(num_samples=5, block_size=16, vocab_size=7, seed=3)
    assert len(ds) == 5
    sample = ds[2]
    assert sample["input_ids"].shape == (16,) and sample["labels"].shape == (16,)
    assert torch.equal(sample["input_ids"][1:], sample["labels"][:-1])
    assert int(sample["input_ids"].max()) < 7 and int(sample["input_ids"].min()) >= 0


def test_reproducible_per_index_and_seed():
    a, b = SyntheticTokenDataset(10, 8, 50, seed=1), SyntheticTokenDataset(10, 8, 50, seed=1)
    assert torch.equal(a[4]["input_ids"], b[4]["input_ids"])
    assert torch.equal(a[-1]["input_ids"], a[9]["input_ids"])
    assert not torch.equal(a[4]["input_ids"], a[5]["input_ids"])
    assert not torch.equal(
        a[4]["input_ids"], SyntheticTokenDataset(10, 8, 50, seed=2)[4]["input_ids"]
    )


def test_bad_arguments_and_index():
    with pytest.raises(DataError, match="num_samples must be positive"):
        SyntheticTokenDataset(num_samples=0)
    with pytest.raises(IndexError):
        SyntheticTokenDataset(num_samples=3)[3]


@pytest.mark.parametrize(
    "sizes, fragment",
    [((10.5, 8, 256), "num_samples must be a positive integer"), ((10, True, 256), "block_size")],
)
def test_sizes_of_the_wrong_type_are_named(sizes, fragment):
    with pytest.raises(DataError, match=f"SyntheticTokenDataset {fragment}"):
        SyntheticTokenDataset(*sizes)


def test_numpy_and_tensor_indices_read_the_same_sample():
    dataset = SyntheticTokenDataset(10, 8, 256)
    for index in (np.int64(3), torch.tensor(3)):
        assert torch.equal(dataset[index]["input_ids"], dataset[3]["input_ids"])
